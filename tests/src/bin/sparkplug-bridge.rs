//! `lw-sparkplug` for the whole-system tests: the same entry point, built
//! in this package so a test can start it (and kill it) as a process.

fn main() -> std::process::ExitCode {
    loopwarden_sparkplug::cli::main()
}
