//! The `tollgate` command; see the library for what it does.

/// The server answers each call with a handful of short-lived allocations spread over tokio's
/// workers; mimalloc serves those from per-thread pages, where the system's allocator takes
/// about a sixth of a call's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate_cli::main()
}
