module github.com/tollgate-rs/tollgate/clients/go

// The floors: the versions the code is generated for and tested with (Debian 12's packages).
// Go's minimal version selection lets a program that uses this module take newer ones.
go 1.19

require (
	github.com/golang/protobuf v1.5.2
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
