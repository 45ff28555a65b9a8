//! `rblk`: the rblk client (see `rblk --help`).

fn main() -> std::process::ExitCode {
    rblk::cli::main()
}
