//! The docs' examples against the binaries' own definitions: every `rblk`, `rblk-target` and
//! `rblk-bench` command in a ```sh block of README.md, docs/client.md and
//! docs/configuration.md parses with that binary's clap `Args` (as `try_parse_from`), and every
//! ```toml block of them parses as rblk-target's config file.
//!
//! A command is a line of a ```sh block, or each part of it between `&&`, `||`, `|` and `;`,
//! split as the shell splits it (quotes, `# comments`), without a trailing `&`, a leading `sudo`
//! or `VAR=value` assignments; a comment line also holds one after a colon
//! (`# or in the foreground: rblk-target --listen ...`). So a flag renamed or removed in the
//! code, a subcommand renamed, or a value its parser now refuses fails this test with the file,
//! the line and clap's error, until the docs say the new spelling.

use clap::Parser as _;

const BINARIES: [&str; 3] = ["rblk", "rblk-target", "rblk-bench"];

/// The docs checked, by their path in the repository.
const DOCS: [(&str, &str); 3] = [
    ("README.md", include_str!("../../../README.md")),
    ("docs/client.md", include_str!("../../../docs/client.md")),
    ("docs/configuration.md", include_str!("../../../docs/configuration.md")),
];

/// The commands of one line of a shell block: each as its words, from the binary's name on.
fn commands(line: &str) -> Result<Vec<Vec<String>>, String> {
    let trimmed = line.trim_start();
    let text = match trimmed.strip_prefix('#') {
        // A comment: a command after a colon, if one starts there.
        Some(comment) => match comment.split_once(": ") {
            Some((_, after)) if starts_with_binary(after.trim_start()) => after,
            _ => return Ok(Vec::new()),
        },
        None => trimmed,
    };
    let words = shlex::split(text).ok_or_else(|| format!("the shell cannot split it (quotes?): {text}"))?;
    let mut out = Vec::new();
    for part in words.split(|w| ["&&", "||", "|", ";"].contains(&w.as_str())) {
        let mut part: Vec<String> = part.to_vec();
        if part.last().is_some_and(|w| w == "&") {
            part.pop();
        }
        let skip = part.iter().take_while(|w| *w == "sudo" || is_assignment(w)).count();
        part.drain(..skip);
        if part.first().is_some_and(|w| BINARIES.contains(&w.as_str())) {
            out.push(part);
        }
    }
    Ok(out)
}

fn starts_with_binary(text: &str) -> bool {
    let text = text.strip_prefix("sudo ").unwrap_or(text);
    BINARIES.iter().any(|b| text.strip_prefix(b).is_some_and(|r| r.starts_with(' ')))
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// clap's verdict on one command; asking for help or the version is a valid command too.
fn parse(words: &[String]) -> Result<(), String> {
    let result = match words[0].as_str() {
        "rblk" => rblk::cli::Args::try_parse_from(words).map(drop),
        "rblk-target" => rblk_target::cli::Args::try_parse_from(words).map(drop),
        "rblk-bench" => rblk_bench::Args::try_parse_from(words).map(drop),
        other => unreachable!("{other} is not one of the binaries"),
    };
    match result {
        Err(e) if !matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            Err(e.render().to_string().trim_end().to_owned())
        }
        _ => Ok(()),
    }
}

/// The fenced blocks of `md`: each one's info string (`sh`), the line number of its first line
/// of code (from 1) and its lines.
fn fenced(md: &str) -> Vec<(&str, usize, Vec<&str>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, usize, Vec<&str>)> = None;
    for (n, line) in md.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (open.as_mut(), fence) {
            (None, Some(lang)) => open = Some((lang.trim(), n + 2, Vec::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => blocks.extend(open.take()),
            (Some((_, _, lines)), _) => lines.push(line),
            (None, None) => {}
        }
    }
    blocks
}

/// Checks the doc `md` (named `name`): how many commands and config files it holds, or the
/// failures, one per line, each with the file and line.
fn check(name: &str, md: &str) -> Result<usize, Vec<String>> {
    let (mut checked, mut failures) = (0, Vec::new());
    for (lang, first, lines) in fenced(md) {
        match lang {
            "sh" => {
                for (n, line) in lines.iter().enumerate() {
                    let at = format!("{name}:{}", first + n);
                    match commands(line) {
                        Err(e) => failures.push(format!("{at}: {e}")),
                        Ok(cmds) => {
                            for words in cmds {
                                checked += 1;
                                if let Err(e) = parse(&words) {
                                    failures.push(format!("{at}: `{}`: {e}", words.join(" ")));
                                }
                            }
                        }
                    }
                }
            }
            "toml" => {
                checked += 1;
                if let Err(e) = toml::from_str::<rblk_target::config::File>(&lines.join("\n")) {
                    failures.push(format!("{name}:{first}: not a config file rblk-target reads: {e}"));
                }
            }
            _ => {}
        }
    }
    if failures.is_empty() {
        Ok(checked)
    } else {
        Err(failures)
    }
}

/// Catches a doc whose example no longer parses: a renamed or removed flag or subcommand, a
/// value a parser refuses, a config key the daemon does not take.
#[test]
fn every_command_in_the_docs_parses() {
    let mut failures = Vec::new();
    for (name, md) in DOCS {
        match check(name, md) {
            // Fewer would mean the extraction lost them, not that they parse.
            Ok(n) => assert!(n >= 5, "{name}: only {n} commands found"),
            Err(f) => failures.extend(f),
        }
    }
    assert!(failures.is_empty(), "commands in the docs that the binaries refuse:\n{}", failures.join("\n"));
}

/// The extraction finds what a reader would run (after sudo, &&, in a comment after a colon,
/// before a trailing &) and nothing else; a renamed flag fails, naming the line and the flag.
#[test]
fn a_renamed_flag_fails_naming_its_line() {
    let md = "```sh\nmodprobe ublk_drv && sudo RBLK_HOST_ID=h rblk attach rblk://h/v --keyfile k &\n\
              # or: rblk-target --listen 10.0.0.1 --volume v:1G   # a comment\n\
              echo rblk attach --nonsense | cat\n```\n";
    let failures = check("x.md", md).unwrap_err();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].starts_with("x.md:2: `rblk attach rblk://h/v --keyfile k`"), "{failures:?}");
    assert!(failures[0].contains("--keyfile"), "{failures:?}");
    let fixed = md.replace("--keyfile", "--key-file");
    assert_eq!(check("x.md", &fixed), Ok(2));
}
