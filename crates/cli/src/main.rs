//! The `tollgate` command; see the library for what it does.

fn main() -> std::process::ExitCode {
    tollgate_cli::main()
}
