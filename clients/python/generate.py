"""Generates the gRPC stubs, with their typing stubs, from Tollgate's contract
(crates/proto/proto/tollgate/v1/tollgate.proto) into tollgate/v1/. Run it once before
installing or testing from a checkout: ``python generate.py`` (needs grpcio-tools)."""

import pathlib
import sys

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE.parent.parent / "crates" / "proto" / "proto"


def main() -> int:
    out = HERE / "tollgate" / "v1"
    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").write_text('"""Generated from tollgate.proto by generate.py."""\n')
    return protoc.main(
        [
            "protoc",
            f"-I{PROTO}",
            f"--python_out={HERE}",
            f"--pyi_out={HERE}",
            f"--grpc_python_out={HERE}",
            str(PROTO / "tollgate" / "v1" / "tollgate.proto"),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
