//! A section-1 page for a command, laid out as man-pages(7) orders it: NAME (`name \- what it
//! does`, one line), SYNOPSIS, DESCRIPTION (the long help without its examples), OPTIONS (a
//! subsection per help heading), COMMANDS, a section of its own for an after-help that has one
//! (rblk-bench's JSON OUTPUT), EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES (`.EX`/`.EE`) and SEE
//! ALSO (man pages only). What clap does not know comes from [`crate::sections`].

use clap::{Arg, ArgAction, Command};
use roff::{bold, italic, roman, Inline, Roff};

use crate::help_text::{self, Block};
use crate::sections::{self, Item};

/// Where a page's command sits: its page name (`rblk-mount`), how it is typed (`rblk mount`)
/// and the page names above it, the binary's first.
pub(crate) struct Place {
    pub(crate) path: Vec<String>,
    pub(crate) usage: String,
    /// The binary's version, for the page's footer.
    pub(crate) version: String,
    /// The binary's name, for the page's footer.
    pub(crate) binary: String,
}

impl Place {
    fn name(&self) -> &str {
        self.path.last().map_or("", String::as_str)
    }
}

/// The page of `cmd` (built) at `place`; an error names what it cannot render.
pub(crate) fn render(cmd: &Command, place: &Place) -> Result<String, String> {
    let name = place.name();
    let extra = sections::resolve(&place.path)?;
    let source = format!("{} {}", place.binary, place.version);
    let mut page = Roff::new();
    page.control("TH", [name, "1", "\"\"", source.as_str(), "User Commands"]);

    page.control("SH", ["NAME"]).text([roman(format!("{name} - {}", summary(cmd, place)))]);

    page.control("SH", ["SYNOPSIS"]);
    synopsis(cmd, place, &mut page);

    let about = cmd.get_long_about().or_else(|| cmd.get_about()).map(|a| strip_name(&a.to_string(), cmd, place));
    let mut blocks = help_text::parse(about.as_deref().unwrap_or_default());
    let after = cmd.get_after_long_help().or_else(|| cmd.get_after_help()).map(ToString::to_string);
    let mut own_section = None;
    if let Some(after) = &after {
        match extra.after_help_section {
            Some(title) => own_section = Some((title, after)),
            None => blocks.extend(help_text::parse(after)),
        }
    }
    let (description, mut examples) = help_text::split_examples(blocks);
    page.control("SH", ["DESCRIPTION"]);
    help_text::render(&description, &mut page, "PP");

    examples.extend(options(cmd, &mut page));
    commands(cmd, place, &mut page);

    if let Some((title, text)) = own_section {
        let (text, more) = help_text::split_examples(help_text::parse(text));
        examples.extend(more);
        page.control("SH", [title]);
        help_text::render(&text, &mut page, "PP");
    }

    page.control("SH", ["EXIT STATUS"]);
    items(&described(extra.exit_status, cmd), &mut page);

    page.control("SH", ["ENVIRONMENT"]);
    items(&environment(cmd, extra.environment), &mut page);

    page.control("SH", ["FILES"]);
    items(&described(extra.files, cmd), &mut page);

    if !examples.is_empty() {
        page.control("SH", ["EXAMPLES"]);
        help_text::render_examples(&examples, &mut page);
    }

    page.control("SH", ["SEE ALSO"]);
    let mut see_also: Vec<String> = Vec::new();
    if let [.., parent, _] = &place.path[..] {
        see_also.push(format!("{parent}(1)"));
    }
    see_also.extend(extra.see_also.iter().map(|s| (*s).to_owned()));
    let own = format!("{name}(1)");
    let mut seen = std::collections::HashSet::new();
    see_also.retain(|s| *s != own && seen.insert(s.clone()));
    page.text(see_also_line(&see_also)?);
    Ok(page.render())
}

/// `name(n), ...` with each name bold, as man-pages(7) writes SEE ALSO.
pub(crate) fn see_also_line(pages: &[String]) -> Result<Vec<Inline>, String> {
    let mut line = Vec::new();
    for (i, p) in pages.iter().enumerate() {
        let (name, section) = p
            .strip_suffix(')')
            .and_then(|p| p.rsplit_once('('))
            .filter(|(n, s)| !n.is_empty() && !s.is_empty())
            .ok_or_else(|| format!("SEE ALSO: {p:?} is not a man page, name(section)"))?;
        if i > 0 {
            line.push(roman(", "));
        }
        line.extend([bold(name), roman(format!("({section})"))]);
    }
    Ok(line)
}

/// The one-line description for NAME: the short help without the command's name in front
/// (`rblk-target: RDMA block ...`), its first sentence, cut at its first colon, semicolon or
/// ", which" when longer than a line; no markup, as whatis(1) shows it.
pub(crate) fn summary(cmd: &Command, place: &Place) -> String {
    let about = cmd.get_about().or_else(|| cmd.get_long_about()).map(ToString::to_string).unwrap_or_default();
    let about = strip_name(about.lines().next().unwrap_or_default(), cmd, place);
    let mut text = about.trim().replace('`', "");
    if let Some(end) = sentence_end(&text) {
        text.truncate(end);
    }
    if text.len() > 72 {
        let cut = [":", ";", ", which "].iter().filter_map(|p| text.find(p)).filter(|&c| c > 20).min();
        if let Some(cut) = cut {
            text.truncate(cut);
        }
    }
    text.trim_end_matches(['.', ' ']).to_owned()
}

/// Where the first sentence of `text` ends (a period before a space), abbreviations aside.
fn sentence_end(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(". ").map(|i| i + from) {
        let word = text[..at].rsplit(' ').next().unwrap_or_default().trim_start_matches(|c: char| !c.is_alphanumeric());
        if !["e.g", "i.e", "etc", "vs"].contains(&word) {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

/// `text` without a leading `NAME:` or `NAME -` naming this command.
fn strip_name(text: &str, cmd: &Command, place: &Place) -> String {
    let trimmed = text.trim_start();
    for name in [place.name(), cmd.get_name(), place.usage.as_str(), place.binary.as_str()] {
        for sep in [":", " -", " \u{2014}"] {
            if let Some(rest) = trimmed.strip_prefix(name).and_then(|r| r.strip_prefix(sep)) {
                return rest.trim_start().to_owned();
            }
        }
    }
    text.to_owned()
}

/// `rblk mount [OPTIONS] URI MOUNTPOINT`; a command whose options conflict with its
/// subcommands (rblk-target: the daemon, or a tool) gets a line for each form.
fn synopsis(cmd: &Command, place: &Place, page: &mut Roff) {
    let has_options = cmd.get_arguments().any(|a| !a.is_positional() && !a.is_hide_set());
    let mut line = vec![bold(place.usage.as_str())];
    if has_options {
        line.extend([roman(" ["), italic("OPTIONS"), roman("]")]);
    }
    for arg in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let (open, close) = if arg.is_required_set() { ("", "") } else { ("[", "]") };
        line.extend([roman(format!(" {open}")), italic(value_name(arg)), roman(close)]);
        if arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
            line.push(roman("..."));
        }
    }
    let has_commands = cmd.get_subcommands().any(|s| s.get_name() != "help" && !s.is_hide_set());
    // Options or a command: the command form's COMMAND is not optional.
    let either = has_commands && cmd.is_args_conflicts_with_subcommands_set();
    if either {
        page.text(line);
        page.control("br", []);
        line = vec![bold(place.usage.as_str())];
    }
    if has_commands {
        let (open, close) = if cmd.is_subcommand_required_set() || either { ("", "") } else { ("[", "]") };
        line.extend([
            roman(format!(" {open}")),
            italic("COMMAND"),
            roman(format!("{close} [")),
            italic("ARGS"),
            roman("]"),
        ]);
    }
    page.text(line);
}

fn value_name(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some(names) if !names.is_empty() => names.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
        _ => arg.get_id().as_str().to_uppercase(),
    }
}

/// OPTIONS: the arguments, then the options without a help heading, then a subsection per
/// heading, in the order clap shows them. Returns the examples of their help texts, for EXAMPLES.
fn options(cmd: &Command, page: &mut Roff) -> Vec<Block> {
    let visible: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set()).collect();
    let mut examples = Vec::new();
    if visible.is_empty() {
        return examples;
    }
    page.control("SH", ["OPTIONS"]);
    let mut sorted = visible.clone();
    sorted.sort_by_key(|a| (!a.is_positional(), a.get_display_order()));
    let mut headings: Vec<Option<&str>> = vec![None];
    for a in &sorted {
        if !headings.contains(&a.get_help_heading()) {
            headings.push(a.get_help_heading());
        }
    }
    for heading in headings {
        if let Some(h) = heading {
            page.control("SS", []).text([roman(h)]);
        }
        for arg in sorted.iter().filter(|a| a.get_help_heading() == heading) {
            examples.extend(option(arg, page));
        }
    }
    examples
}

/// An option's tagged paragraph; returns the examples of its help text.
fn option(arg: &Arg, page: &mut Roff) -> Vec<Block> {
    let mut tag = Vec::new();
    if arg.is_positional() {
        tag.push(italic(value_name(arg)));
    } else {
        if let Some(short) = arg.get_short() {
            tag.push(bold(format!("-{short}")));
        }
        if let Some(long) = arg.get_long() {
            if !tag.is_empty() {
                tag.push(roman(", "));
            }
            tag.push(bold(format!("--{long}")));
        }
        let takes = arg.get_num_args().is_some_and(|n| n.takes_values())
            && !matches!(
                arg.get_action(),
                ArgAction::SetTrue
                    | ArgAction::SetFalse
                    | ArgAction::Count
                    | ArgAction::Help
                    | ArgAction::HelpShort
                    | ArgAction::HelpLong
                    | ArgAction::Version
            );
        if takes {
            let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
            let sep = if arg.is_require_equals_set() { "=" } else { " " };
            if optional {
                tag.extend([roman(format!("[{sep}")), italic(value_name(arg)), roman("]")]);
            } else {
                tag.extend([roman(sep), italic(value_name(arg))]);
            }
        }
        let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        if takes && !defaults.is_empty() && !arg.is_hide_default_value_set() {
            tag.push(roman(format!(" [default: {}]", defaults.join(","))));
        }
    }
    page.control("TP", []).text(tag);
    let help = arg.get_long_help().or_else(|| arg.get_help()).map(ToString::to_string).unwrap_or_default();
    let (help, examples) = help_text::split_examples(help_text::parse(&help));
    help_text::render(&help, page, "");
    let values: Vec<_> = arg.get_possible_values().into_iter().filter(|v| !v.is_hide_set()).collect();
    let is_flag = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    if !values.is_empty() && !is_flag {
        if values.iter().any(|v| v.get_help().is_some()) {
            page.control("IP", []).text([italic("Possible values:")]);
            page.control("RS", []);
            for v in &values {
                page.control("TP", []).text([bold(v.get_name())]);
                if let Some(help) = v.get_help() {
                    page.text(help_text::inlines(&help.to_string()));
                }
            }
            page.control("RE", []);
        } else {
            let mut line = vec![italic("Possible values: ")];
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    line.push(roman(", "));
                }
                line.push(bold(v.get_name()));
            }
            page.control("IP", []).text(line);
        }
    }
    // Even where -h hides it (hide_env keeps -h short): the page is the full reference.
    if let Some(env) = arg.get_env() {
        page.control("IP", []).text([
            roman("Also taken from the environment variable "),
            bold(env.to_string_lossy().into_owned()),
            roman("."),
        ]);
    }
    examples
}

/// COMMANDS: each subcommand, its one line and its page.
fn commands(cmd: &Command, place: &Place, page: &mut Roff) {
    let subs: Vec<&Command> = cmd.get_subcommands().filter(|s| s.get_name() != "help" && !s.is_hide_set()).collect();
    if subs.is_empty() {
        return;
    }
    page.control("SH", ["COMMANDS"]);
    for sub in subs {
        let sub_place = Place {
            path: place.path.iter().cloned().chain([format!("{}-{}", place.name(), sub.get_name())]).collect(),
            usage: format!("{} {}", place.usage, sub.get_name()),
            version: place.version.clone(),
            binary: place.binary.clone(),
        };
        page.control("TP", []).text([bold(sub.get_name())]);
        page.text([roman(format!("{}. See ", summary(sub, &sub_place))), bold(sub_place.name()), roman("(1).")]);
    }
}

/// Tagged paragraphs, the tag bold.
fn items(list: &[(String, String)], page: &mut Roff) {
    for (name, text) in list {
        page.control("TP", []).text([bold(name.as_str())]);
        page.text(help_text::inlines(text));
    }
}

/// The items of `table` shown on `cmd`'s page, as (tag, text).
fn described(table: &[Item], cmd: &Command) -> Vec<(String, String)> {
    table.iter().filter(|i| shown(i, cmd)).map(|i| (i.name.to_owned(), i.text.to_owned())).collect()
}

/// True if `cmd` or a subcommand of it has the long flag `--x` or is the subcommand `x`.
fn has(cmd: &Command, what: &str) -> bool {
    let found = match what.strip_prefix("--") {
        Some(flag) => cmd.get_arguments().any(|a| a.get_long() == Some(flag)),
        None => cmd.get_name() == what,
    };
    found || cmd.get_subcommands().any(|s| has(s, what))
}

fn shown(item: &Item, cmd: &Command) -> bool {
    item.on.is_empty() || item.on.iter().any(|w| has(cmd, w))
}

/// The variables clap reads for `cmd` and its subcommands (their flag's page says what they
/// mean), with the table's text where it has one, then the table's other variables.
fn environment(cmd: &Command, table: &[Item]) -> Vec<(String, String)> {
    fn clap_env(cmd: &Command, out: &mut Vec<(String, String)>) {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let (Some(env), Some(long)) = (a.get_env(), a.get_long()) {
                let env = env.to_string_lossy().into_owned();
                if !out.iter().any(|(e, _)| *e == env) {
                    out.push((env, long.to_owned()));
                }
            }
        }
        for s in cmd.get_subcommands() {
            clap_env(s, out);
        }
    }
    let mut from_clap = Vec::new();
    clap_env(cmd, &mut from_clap);
    let mut out = described(table, cmd);
    for (env, long) in from_clap {
        if !out.iter().any(|(name, _)| *name == env) {
            out.push((env, format!("The value of `--{long}` when the flag is not given.")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(path: &[&str], usage: &str) -> Place {
        Place {
            path: path.iter().map(|p| (*p).to_owned()).collect(),
            usage: usage.to_owned(),
            version: "1".to_owned(),
            binary: path[0].to_owned(),
        }
    }

    /// Trap 9 (man pages), NAME: catches the name repeated in its own description (an about
    /// that starts `rblk-target:`, as Cargo's description does), a description longer than
    /// its first sentence, and markup that whatis(1) would show raw.
    #[test]
    fn name_is_one_line_without_the_name() {
        let cmd = Command::new("rblk-target").about("rblk-target: RDMA block storage target daemon");
        assert_eq!(summary(&cmd, &place(&["rblk-target"], "rblk-target")), "RDMA block storage target daemon");
        let cmd = Command::new("discover").about(
            "List the volumes (as `nvme discover` does, e.g. for NVMe-oF). Opens nothing. (`rblk list` lists more.)",
        );
        assert_eq!(
            summary(&cmd, &place(&["rblk", "rblk-discover"], "rblk discover")),
            "List the volumes (as nvme discover does, e.g. for NVMe-oF)"
        );
        let cmd = Command::new("stats")
            .about("Show the target's counters: registrations, pinned bytes, sessions, connections and its CPU time");
        assert_eq!(summary(&cmd, &place(&["rblk", "rblk-stats"], "rblk stats")), "Show the target's counters");
    }
}
