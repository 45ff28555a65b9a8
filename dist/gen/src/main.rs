//! `rblk-dist OUTDIR` (arguments parsed by clap: `--help`, `--version`): writes shell completions (bash, zsh, fish) and man pages (section 1, one
//! per command and subcommand) for rblk, rblk-bench and rblk-target, generated from their clap definitions,
//! so they always match `--help`, and the config file's page, rblk-target.toml(5), rendered from
//! docs/configuration.md. `scripts/install.sh` runs it.
//!
//! Those three are the binaries users run. The workspace's others get no pages: rblk-test-client
//! and rblk-lane-bench (tests/) are test tools, and rblk-dist is this build tool.
//!
//! Layout: OUTDIR/completions/{bash/NAME.bash, zsh/_NAME, fish/NAME.fish} (install bash's as
//! `bash-completion/completions/NAME`), OUTDIR/man/NAME[-SUB].1, OUTDIR/man/rblk-target.toml.5.

#![forbid(unsafe_code)]

mod config_page;
#[cfg(test)]
mod doc_commands;
mod markdown;

use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory as _;
use clap_complete::Shell;

/// Write shell completions (bash, zsh, fish) and man pages for rblk, rblk-bench and rblk-target
///
/// Generated from the binaries' own command-line definitions, so they always match `--help`,
/// and rblk-target.toml(5) from docs/configuration.md. Layout: OUTDIR/completions/{bash/NAME.bash,
/// zsh/_NAME, fish/NAME.fish}, OUTDIR/man/NAME[-SUB].1, OUTDIR/man/rblk-target.toml.5.
/// `scripts/install.sh` runs it.
#[derive(Debug, clap::Parser)]
#[command(name = "rblk-dist", version)]
struct Args {
    /// Where to write them (created if missing).
    outdir: std::path::PathBuf,
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let out = args.outdir;
    match generate(Path::new(&out)) {
        Ok(n) => {
            eprintln!("rblk-dist: wrote {n} files under {}", Path::new(&out).display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rblk-dist: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes everything under `out`; returns how many files.
fn generate(out: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for cmd in [rblk::cli::Args::command(), rblk_bench::Args::command(), rblk_target::cli::Args::command()] {
        n += completions(cmd.clone(), out)?;
        n += man_pages(cmd, &out.join("man"))?;
    }
    let version = rblk_target::cli::Args::command().get_version().unwrap_or_default().to_owned();
    let page = config_page::page(&version).map_err(std::io::Error::other)?;
    std::fs::write(out.join("man").join(config_page::FILE_NAME), page)?;
    Ok(n + 1)
}

fn completions(mut cmd: clap::Command, out: &Path) -> std::io::Result<usize> {
    let name = cmd.get_name().to_owned();
    for (shell, dir) in [(Shell::Bash, "bash"), (Shell::Zsh, "zsh"), (Shell::Fish, "fish")] {
        let dir = out.join("completions").join(dir);
        std::fs::create_dir_all(&dir)?;
        clap_complete::generate_to(shell, &mut cmd, &name, &dir)?;
    }
    Ok(3)
}

/// A page for the command and one for each subcommand (`rblk-attach.1`, as git does).
fn man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd;
    cmd.build();
    let mut n = 0;
    let mut todo = vec![(cmd.get_name().to_owned(), cmd)];
    while let Some((name, cmd)) = todo.pop() {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            todo.push((format!("{name}-{}", sub.get_name()), sub.clone().name(format!("{name}-{}", sub.get_name()))));
        }
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    /// Catches arguments parsed by hand again: `rblk-dist --version` once wrote 28 files into a
    /// directory named `--version` and exited 0.
    #[test]
    fn flags_are_flags_not_directories() {
        use clap::Parser as _;
        let e = super::Args::try_parse_from(["rblk-dist", "--version"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
        let e = super::Args::try_parse_from(["rblk-dist"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert_eq!(super::Args::try_parse_from(["rblk-dist", "out"]).unwrap().outdir, std::path::Path::new("out"));
    }

    /// Catches completions or man pages that are not generated (or are empty) for a command a
    /// user runs: every binary's page and its subcommands' pages exist and name their flags; the
    /// config file's page exists, rblk-target's points to it, and the pages its SEE ALSO names exist.
    #[test]
    fn writes_completions_and_man_pages() {
        let out = std::env::temp_dir().join(format!("rblk-dist-{}", std::process::id()));
        let n = super::generate(&out).unwrap();
        let read = |p: &str| std::fs::read_to_string(out.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(read("completions/bash/rblk.bash").contains("--host-id"));
        assert!(read("completions/zsh/_rblk-bench").contains("--iodepth"));
        assert!(read("completions/fish/rblk.fish").contains("attach"));
        assert!(read("man/rblk.1").contains(".TH rblk"));
        assert!(read("man/rblk-attach.1").contains("fast\\-io\\-fail\\-tmo"), "the attach page lists its flags");
        assert!(read("man/rblk-bench.1").contains("iodepth"));
        assert!(read("man/rblk-target.1").contains("check\\-config"));
        assert!(read("completions/bash/rblk-target.bash").contains("--max-sessions-per-host"));
        let config = read("man/rblk-target.toml.5");
        assert!(config.contains(".TH rblk-target.toml 5") && config.contains("max_joins_per_host"));
        for name in super::config_page::SEE_ALSO {
            read(&format!("man/{name}.1"));
        }
        assert!(read("man/rblk-target.1").contains("rblk\\-target.toml(5)"), "rblk-target's page points to it");
        assert!(n > 10, "{n} files");
        std::fs::remove_dir_all(&out).unwrap();
    }
}
