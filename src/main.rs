//! The `urutan` binary: every command of [`urutan_cli`], no Rust handler.

fn main() -> std::process::ExitCode {
    urutan_cli::main()
}
