//! `rblk-dist OUTDIR` (arguments parsed by clap: `--help`, `--version`): writes shell completions (bash, zsh, fish) and man pages (section 1, one
//! per command and subcommand) for rblk, rblk-bench and rblk-target, generated from their clap definitions,
//! so they always match `--help`, and the config file's page, rblk-target.toml(5), rendered from
//! docs/configuration.md. `scripts/install.sh` runs it.
//!
//! Those three are the binaries users run. The workspace's others get no pages: rblk-test-client
//! (tests/) and rblk-lane-bench (bench/lane/) are test tools, and rblk-dist is this build tool.
//!
//! Layout: OUTDIR/completions/{bash/NAME.bash, zsh/_NAME, fish/NAME.fish} (install bash's as
//! `bash-completion/completions/NAME`), OUTDIR/man/NAME[-SUB].1, OUTDIR/man/rblk-target.toml.5.
//!
//! A section-1 page (`man_page.rs`) takes NAME, SYNOPSIS, DESCRIPTION, OPTIONS and the examples
//! from clap (`help_text.rs` reads the help texts), and EXIT STATUS, ENVIRONMENT, FILES and SEE
//! ALSO from one table, `sections.rs`: a new subcommand, flag with `env`, or exit code is
//! documented there, and the tests fail on a page that lacks any of them.

#![forbid(unsafe_code)]

mod config_page;
#[cfg(test)]
mod doc_commands;
mod help_text;
mod man_page;
mod markdown;
mod sections;

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

/// The command lines of the binaries users run.
fn commands() -> [clap::Command; 3] {
    [rblk::cli::Args::command(), rblk_bench::Args::command(), rblk_target::cli::Args::command()]
}

/// Writes everything under `out`; returns how many files.
fn generate(out: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for cmd in commands() {
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
    let binary = cmd.get_name().to_owned();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let mut n = 0;
    let top = man_page::Place { path: vec![binary.clone()], usage: binary.clone(), version, binary };
    let mut todo = vec![(top, cmd)];
    while let Some((place, cmd)) = todo.pop() {
        let name = place.path.last().cloned().unwrap_or_default();
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help" && !s.is_hide_set()) {
            let sub_place = man_page::Place {
                path: place.path.iter().cloned().chain([format!("{name}-{}", sub.get_name())]).collect(),
                usage: format!("{} {}", place.usage, sub.get_name()),
                version: place.version.clone(),
                binary: place.binary.clone(),
            };
            todo.push((sub_place, sub.clone()));
        }
        let page = man_page::render(&cmd, &place).map_err(std::io::Error::other)?;
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

    /// Issue 43, trap 8: `-h` was a wall (`rblk read -h` had option lines of 150 to 525
    /// characters, rblk-target's up to 766). Catches any command or subcommand of rblk,
    /// rblk-bench and rblk-target whose `-h`, at a 100-column terminal, is wider than 100
    /// columns or longer than 40 lines: the prose belongs in `--help` (a doc comment's later
    /// paragraphs), `-h` gets its first. (Each crate's own tests check its headings and that
    /// the prose is still in `--help`.)
    #[test]
    fn every_short_help_fits_100_columns_and_40_lines() {
        let mut todo: Vec<(String, clap::Command)> =
            super::commands().into_iter().map(|c| (c.get_name().to_owned(), c.term_width(100))).collect();
        let mut seen = 0;
        while let Some((path, mut cmd)) = todo.pop() {
            cmd.build();
            let help = cmd.render_help().to_string();
            let widest = help.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            assert!(widest <= 100, "{path} -h has a line of {widest} columns:\n{help}");
            assert!(help.lines().count() <= 40, "{path} -h has {} lines:\n{help}", help.lines().count());
            todo.extend(cmd.get_subcommands().map(|sub| (format!("{path} {}", sub.get_name()), sub.clone())));
            seen += 1;
        }
        assert!(seen > 25, "the three binaries and their subcommands: {seen}");
    }

    /// Catches completions or man pages that are not generated (or are empty) for a command a
    /// user runs: every binary's page and its subcommands' pages exist and name their flags; the
    /// config file's page exists, rblk-target's points to it, and the pages its SEE ALSO names exist.
    ///
    /// Trap 9 of issue 43 (man pages), on every page generated: `man --warnings` prints nothing
    /// (clap_mangen's `.TH` with an empty date shifted its fields); NAME is `name \- summary`
    /// without the name again (`rblk-target - rblk-target: RDMA ...`); each section-1 page has
    /// EXIT STATUS, ENVIRONMENT (with every variable clap reads), FILES and SEE ALSO, filled in;
    /// SEE ALSO names man pages (`name(n)`, the rblk ones generated here), never a `.md` file; the
    /// examples of every help text are in `.EX`/`.EE` under EXAMPLES, not reflowed in the
    /// description; and rblk-bench's JSON fields are a list under JSON OUTPUT, not text under EXTRA.
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
        assert!(read("man/rblk-target.1").contains("\\fBrblk\\-target.toml\\fR(5)"), "rblk-target's page points to it");
        assert!(n > 10, "{n} files");

        let mut pages: Vec<String> = std::fs::read_dir(out.join("man"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        pages.sort();
        assert!(pages.len() > 20, "{pages:?}");
        for entry in super::sections::PAGES {
            assert!(
                pages.contains(&format!("{}.1", entry.page)),
                "sections.rs has an entry for {}, no page",
                entry.page
            );
        }
        let mut examples_checked = 0;
        for file in &pages {
            let text = read(&format!("man/{file}"));
            let (name, section) = file.rsplit_once('.').unwrap();
            let warnings = man_warnings(&out.join("man").join(file));
            assert!(warnings.is_empty(), "man --warnings -l {file}:\n{warnings}");

            let name_line = text.split(".SH NAME\n").nth(1).and_then(|r| r.lines().next()).unwrap_or_default();
            let escaped = name.replace('-', "\\-");
            let summary = name_line
                .strip_prefix(&format!("{escaped} \\- "))
                .unwrap_or_else(|| panic!("{file}: NAME {name_line:?}"));
            assert!(
                !summary.starts_with(&escaped) && !summary.contains(&format!("{escaped}:")) && !summary.contains('\n'),
                "{file}: NAME repeats the name: {name_line:?}"
            );

            let see_also = section_text(&text, "SEE ALSO").unwrap_or_else(|| panic!("{file}: no SEE ALSO"));
            // The help texts are the CLI crates' (their own .md mentions are theirs); the
            // config page is rendered from markdown here, links and all.
            let generated_text = if section == "5" { text.as_str() } else { see_also };
            assert!(
                !generated_text.contains(".md"),
                "{file} names a .md file, which an installed system does not have"
            );
            for entry in see_also.trim().split(", ") {
                let page = entry.strip_prefix("\\fB").and_then(|e| e.split_once("\\fR("));
                let (page, n) = page.unwrap_or_else(|| panic!("{file}: SEE ALSO {entry:?} is not a man page"));
                let page = page.replace("\\-", "-");
                assert!(n.ends_with(')') && !page.is_empty(), "{file}: SEE ALSO {entry:?}");
                if page.starts_with("rblk") {
                    let generated = format!("{page}.{}", n.trim_end_matches(')'));
                    assert!(pages.contains(&generated), "{file}: SEE ALSO {page}({n}, which rblk-dist does not write");
                }
            }
            if section != "1" {
                continue;
            }
            for part in ["EXIT STATUS", "ENVIRONMENT", "FILES"] {
                let body = section_text(&text, part).unwrap_or_else(|| panic!("{file}: no {part}"));
                assert!(body.starts_with(".TP\n\\fB"), "{file}: {part} is empty");
            }
            let exit = section_text(&text, "EXIT STATUS").unwrap();
            for code in ["0", "1", "2"] {
                assert!(exit.contains(&format!(".TP\n\\fB{code}\\fR\n")), "{file}: EXIT STATUS has no {code}");
            }
            assert!(!text.contains(".SH EXTRA") && !text.contains("Examples:"), "{file}: clap_mangen's layout");

            // The help texts' examples, each line in .EX/.EE under EXAMPLES.
            let cmd = command_of(name);
            let helps = [cmd.get_long_about(), cmd.get_after_long_help()];
            for help in helps.into_iter().flatten().map(ToString::to_string) {
                let Some((_, after)) = help.split_once("Examples:\n") else { continue };
                let examples = section_text(&text, "EXAMPLES").unwrap_or_else(|| panic!("{file}: no EXAMPLES"));
                for line in after.lines().take_while(|l| l.starts_with("  ")) {
                    let line = line.trim().replace('\\', "\\\\").replace('-', "\\-").replace('\'', "\\*(Aq");
                    let block = examples.split(".EX\n").skip(1).find_map(|b| b.split_once(".EE\n").map(|(b, _)| b));
                    let inside = examples
                        .split(".EX\n")
                        .skip(1)
                        .any(|b| b.split(".EE\n").next().unwrap().lines().any(|l| l == line));
                    assert!(inside, "{file}: example {line:?} is not a line of an .EX block: {block:?}");
                    examples_checked += 1;
                }
            }
            // Every variable clap reads is explained.
            let environment = section_text(&text, "ENVIRONMENT").unwrap();
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(env) = arg.get_env() {
                    let tag = format!(".TP\n\\fB{}\\fR\n", env.to_string_lossy());
                    assert!(environment.contains(&tag), "{file}: ENVIRONMENT has no {env:?}");
                }
            }
        }
        assert!(examples_checked >= 8, "only {examples_checked} example lines found in the help texts");
        let bench = read("man/rblk-bench.1");
        let json = section_text(&bench, "JSON OUTPUT").expect("rblk-bench(1) has a JSON OUTPUT section");
        assert!(json.contains(".TP\n\\fBjobs\\fR\n") && json.contains(".TP\n\\fBrblk_version\\fR\n"), "{json}");
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// The text of a page's section `title`, up to the next `.SH`.
    fn section_text<'a>(page: &'a str, title: &str) -> Option<&'a str> {
        let heading = if title.contains(' ') { format!(".SH \"{title}\"\n") } else { format!(".SH {title}\n") };
        let rest = page.split_once(&heading)?.1;
        Some(rest.split("\n.SH ").next().unwrap_or(rest))
    }

    /// The command a section-1 page `name` documents (`rblk-target-admin-add`).
    fn command_of(name: &str) -> clap::Command {
        use clap::CommandFactory as _;
        let mut found = None;
        for mut cmd in [rblk::cli::Args::command(), rblk_bench::Args::command(), rblk_target::cli::Args::command()] {
            cmd.build();
            let mut todo = vec![(cmd.get_name().to_owned(), cmd)];
            while let Some((page, cmd)) = todo.pop() {
                todo.extend(cmd.get_subcommands().map(|s| (format!("{page}-{}", s.get_name()), s.clone())));
                if page == name {
                    found = Some(cmd);
                }
            }
        }
        found.unwrap_or_else(|| panic!("no command has the page {name}"))
    }

    /// What `man --warnings -l PAGE` prints on stderr at 80 columns (man-db; scripts/deps.sh
    /// installs it): nothing for a good page. Missing man fails the test.
    fn man_warnings(page: &std::path::Path) -> String {
        let out = std::process::Command::new("man")
            .args(["--warnings", "-l"])
            .arg(page)
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running man (Debian's man-db, which scripts/deps.sh installs)");
        assert!(out.status.success(), "man -l {}: {}", page.display(), String::from_utf8_lossy(&out.stderr));
        assert!(!out.stdout.is_empty(), "man -l {} rendered nothing", page.display());
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}
