//! The `tollgate` command; see the library for what it does.

/// mimalloc rather than the C library's allocator: a served call allocates a few small
/// buffers (the HTTP/2 frames, the decoded request, the answer), freed on another thread as
/// often as not, which glibc's allocator pays for in locks and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate_cli::main()
}
