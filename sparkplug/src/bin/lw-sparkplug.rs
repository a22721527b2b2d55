//! `lw-sparkplug`: publishes a Loopwarden site as Sparkplug B
//! (`docs/sparkplug.md`).

fn main() -> std::process::ExitCode {
    loopwarden_sparkplug::cli::main()
}
