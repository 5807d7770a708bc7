//! The `waku` command; everything lives in [`wakuwaku::cli`].

fn main() -> std::process::ExitCode {
    wakuwaku::cli::main()
}
