//! The markdown of rblk's docs, parsed into blocks, and rendered as roff for a man page: the
//! subset docs/configuration.md uses (headings, paragraphs, bullet lists, fenced code, pipe
//! tables; inline `code`, **bold**, *italic* and links). Anything else is an error naming its
//! line, so an edit that uses more markdown fails rblk-dist and its tests instead of coming out
//! garbled in the page.

use roff::{bold, italic, line_break, roman, Inline, Roff};

/// A block of a markdown document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    /// `## text`: level 2.
    Heading { level: usize, text: String },
    /// Lines up to a blank line or another block, joined with spaces.
    Paragraph(String),
    /// `- item` lines; an item's indented continuation lines are joined to it.
    List(Vec<String>),
    /// A fenced block's lines, without the fence's indentation.
    Code(Vec<String>),
    /// A pipe table: the header cells and the rows' cells (`\|` is a `|` in a cell).
    Table { header: Vec<String>, rows: Vec<Vec<String>> },
}

/// Parses `md` into blocks; an error names the line (from 1) of markdown this does not render.
pub(crate) fn parse(md: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = md.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            i += 1;
        } else if line.trim_start().starts_with("```") {
            let indent = line.len() - line.trim_start().len();
            let start = i + 1;
            let mut code = Vec::new();
            i += 1;
            loop {
                let l = lines.get(i).ok_or_else(|| format!("line {start}: a code block that does not end"))?;
                i += 1;
                if l.trim() == "```" {
                    break;
                }
                let cut = l.len() - l.trim_start().len();
                code.push(l[cut.min(indent)..].to_owned());
            }
            blocks.push(Block::Code(code));
        } else if let Some((level, text)) = heading(line) {
            blocks.push(Block::Heading { level, text: text.to_owned() });
            i += 1;
        } else if line.starts_with('|') {
            let start = i;
            let header = cells(line);
            let separator = lines.get(i + 1).map(|l| cells(l)).unwrap_or_default();
            let dashes = |c: &String| c.len() >= 3 && c.trim_matches(':').chars().all(|c| c == '-');
            if separator.len() != header.len() || !separator.iter().all(dashes) {
                return Err(format!("line {}: a table needs a |---| line under its header", start + 1));
            }
            i += 2;
            let mut rows = Vec::new();
            while let Some(l) = lines.get(i).filter(|l| l.starts_with('|')) {
                let row = cells(l);
                if row.len() != header.len() {
                    return Err(format!("line {}: {} cells in a table of {} columns", i + 1, row.len(), header.len()));
                }
                rows.push(row);
                i += 1;
            }
            blocks.push(Block::Table { header, rows });
        } else if let Some(first) = line.strip_prefix("- ") {
            let mut items = vec![first.trim().to_owned()];
            i += 1;
            while let Some(l) = lines.get(i) {
                if let Some(item) = l.strip_prefix("- ") {
                    items.push(item.trim().to_owned());
                } else if l.starts_with(' ') && !l.trim().is_empty() {
                    unsupported(l.trim(), i).map_err(|e| format!("{e} (in a list item: nested blocks)"))?;
                    let last = items.last_mut().expect("a list has an item");
                    last.push(' ');
                    last.push_str(l.trim());
                } else if !(l.trim().is_empty() && lines.get(i + 1).is_some_and(|n| n.starts_with("- "))) {
                    break;
                }
                i += 1;
            }
            blocks.push(Block::List(items));
        } else {
            if line.starts_with("    ") {
                return Err(format!("line {}: an indented code block (use a fenced one)", i + 1));
            }
            unsupported(line.trim(), i)?;
            let mut text = line.trim().to_owned();
            i += 1;
            while let Some(l) = lines.get(i).filter(|l| !l.trim().is_empty() && !starts_block(l)) {
                unsupported(l.trim(), i)?;
                text.push(' ');
                text.push_str(l.trim());
                i += 1;
            }
            blocks.push(Block::Paragraph(text));
        }
    }
    Ok(blocks)
}

fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.bytes().take_while(|&b| b == b'#').count();
    let text = line[level..].strip_prefix(' ')?;
    (1..=6).contains(&level).then_some((level, text.trim()))
}

fn starts_block(line: &str) -> bool {
    heading(line).is_some() || line.starts_with('|') || line.starts_with("- ") || line.trim_start().starts_with("```")
}

/// Refuses a line (0-based `i`) that starts markdown this module does not render.
fn unsupported(trimmed: &str, i: usize) -> Result<(), String> {
    let ordered = trimmed.split_once(". ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let what = if trimmed.starts_with("- ") || trimmed.starts_with("* ") || trimmed.starts_with("+ ") || ordered {
        "a list item"
    } else if trimmed.starts_with('>') {
        "a block quote"
    } else if trimmed.starts_with('<') {
        "HTML"
    } else if trimmed.starts_with("```") {
        "a code fence"
    } else if trimmed.starts_with('|') {
        "a table row"
    } else if ["---", "***", "___", "==="].iter().any(|r| trimmed.starts_with(r)) {
        "a rule or an underlined heading"
    } else {
        return Ok(());
    };
    Err(format!("line {}: {what} that the man page renderer does not handle here", i + 1))
}

/// A table row's cells, trimmed; `\|` is a `|` inside a cell.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = if row.ends_with('|') && !row.ends_with("\\|") { &row[..row.len() - 1] } else { row };
    let mut out = vec![String::new()];
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        let cell = out.last_mut().expect("one cell at least");
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => cell.push(c),
        }
    }
    out.iter().map(|c| c.trim().to_owned()).collect()
}

/// Inline markdown as roff: `code` and **strong** bold, *emphasis* italic, a link as its text
/// ([`link_text`]), `\X` as X for punctuation X.
pub(crate) fn inlines(text: &str) -> Vec<Inline> {
    let mut out = Vec::new();
    let mut plain = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let styled = |inner: &str, strong: bool| -> Vec<Inline> {
            inlines(inner)
                .into_iter()
                .map(|i| match i {
                    Inline::Roman(s) | Inline::Italic(s) | Inline::Bold(s) if strong => bold(s),
                    Inline::Roman(s) | Inline::Italic(s) | Inline::Bold(s) => italic(s),
                    other => other,
                })
                .collect()
        };
        let span: Option<(Vec<Inline>, usize)> = match c {
            '`' => rest[1..].find('`').map(|end| (vec![bold(&rest[1..1 + end])], end + 2)),
            '*' if rest.starts_with("**") => rest[2..].find("**").map(|end| (styled(&rest[2..2 + end], true), end + 4)),
            '*' if rest[1..].starts_with(|n: char| !n.is_whitespace()) => {
                rest[1..].find('*').map(|end| (styled(&rest[1..1 + end], false), end + 2))
            }
            '[' => link(rest).map(|(label, target, used)| (link_text(label, target), used)),
            '\\' if rest[1..].starts_with(|n: char| n.is_ascii_punctuation()) => {
                plain.push_str(&rest[1..2]);
                rest = &rest[2..];
                continue;
            }
            _ => None,
        };
        match span {
            Some((parts, used)) => {
                if !plain.is_empty() {
                    out.push(roman(std::mem::take(&mut plain)));
                }
                out.extend(parts);
                rest = &rest[used..];
            }
            None => {
                plain.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    if !plain.is_empty() {
        out.push(roman(plain));
    }
    out
}

/// `[label](target)` at the start of `text`: the label, the target and the bytes the link takes.
fn link(text: &str) -> Option<(&str, &str, usize)> {
    let close = text.find("](")?;
    let label = &text[1..close];
    if label.contains(['[', ']']) {
        return None;
    }
    let end = close + 2 + text[close + 2..].find(')')?;
    Some((label, &text[close + 2..end], end + 1))
}

/// What a doc that links point to is on an installed system, which has no .md files.
#[derive(Clone, Copy)]
enum LinkedDoc {
    /// A man page: name, section.
    Page(&'static str, &'static str),
    /// No page: the doc in words.
    Words(&'static str),
}

/// The docs links point to, by file name.
const LINKED_DOCS: &[(&str, LinkedDoc)] = &[
    ("client.md", LinkedDoc::Page("rblk", "1")),
    ("README.md", LinkedDoc::Page("rblk", "1")),
    ("recovery.md", LinkedDoc::Words("the recovery notes of rblk's documentation")),
    ("protocol.md", LinkedDoc::Words("rblk's protocol description")),
    ("DESIGN.md", LinkedDoc::Words("rblk's design notes")),
];

/// A link as a man page shows it: a link within the page, or one whose label is prose, as its
/// label; one labelled with a doc's file name (`[client.md](client.md#metrics)`) as the doc's
/// man page, or what the doc is in words. A file name no entry of [`LINKED_DOCS`] knows stays
/// as written, which the config page's test refuses.
fn link_text(label: &str, target: &str) -> Vec<Inline> {
    let file = target.split('#').next().unwrap_or_default().rsplit('/').next().unwrap_or_default();
    if !label.ends_with(".md") {
        return inlines(label);
    }
    match LINKED_DOCS.iter().find(|(f, _)| *f == file).map(|(_, to)| *to) {
        Some(LinkedDoc::Page(page, section)) => vec![bold(page), roman(format!("({section})"))],
        Some(LinkedDoc::Words(words)) => vec![roman(words)],
        None => inlines(label),
    }
}

/// Renders `blocks` into `page`: a level-1 heading is left out (the page has its own title),
/// level 2 is a section (.SH, upper case), deeper ones subsections (.SS); a table is a tagged
/// paragraph (.TP) per row, its first cell the tag and each further cell but the last one
/// labelled with its column's header.
pub(crate) fn render(blocks: &[Block], page: &mut Roff) {
    for block in blocks {
        match block {
            Block::Heading { level: 1, .. } => {}
            Block::Heading { level: 2, text } => {
                page.control("SH", []).text(inlines(&text.to_uppercase()));
            }
            Block::Heading { text, .. } => {
                page.control("SS", []).text(inlines(text));
            }
            Block::Paragraph(text) => {
                page.control("PP", []).text(inlines(text));
            }
            Block::List(items) => {
                for item in items {
                    page.control("IP", ["\\(bu", "2"]).text(inlines(item));
                }
            }
            Block::Code(lines) => {
                page.control("PP", []).control("RS", ["4"]).control("EX", []);
                for line in lines {
                    page.text([roman(line.as_str())]);
                }
                page.control("EE", []).control("RE", []);
            }
            Block::Table { header, rows } => {
                for row in rows {
                    page.control("TP", []).text(inlines(&row[0]));
                    let mut body = Vec::new();
                    for (n, (head, cell)) in header.iter().zip(row).enumerate().skip(1) {
                        if n + 1 < row.len() {
                            let mut label = head.clone();
                            if let Some(first) = label.get_mut(..1) {
                                first.make_ascii_uppercase();
                            }
                            body.extend([italic(label), roman(": ")]);
                            body.extend(inlines(cell));
                            body.push(line_break());
                        } else {
                            body.extend(inlines(cell));
                        }
                    }
                    page.text(body);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roff_of(md: &str) -> String {
        let mut page = Roff::new();
        render(&parse(md).unwrap(), &mut page);
        page.to_roff()
    }

    /// Catches a construct of docs/configuration.md rendered wrongly: each one's roff, with
    /// roff's escapes (`\-` for a hyphen) and a code line starting with a dot kept literal.
    #[test]
    fn renders_each_construct() {
        let md = "# Title\n\nIntro `--flag` and **strong** and *em*, see [Keys](#keys).\n\n## Keys\n\n\
                  - one\n  continued\n\n- two\n\n```sh\n.hidden -x\n  indented\n```\n\n\
                  ### `[[host]]` tables\n\n| key | default | meaning |\n|---|---|---|\n\
                  | `name` | none | what it is: a\\|b |\n";
        assert_eq!(
            roff_of(md),
            ".PP\nIntro \\fB\\-\\-flag\\fR and \\fBstrong\\fR and \\fIem\\fR, see Keys.\n\
             .SH\nKEYS\n\
             .IP \\(bu 2\none continued\n.IP \\(bu 2\ntwo\n\
             .PP\n.RS 4\n.EX\n\\&.hidden \\-x\n  indented\n.EE\n.RE\n\
             .SS\n\\fB[[host]]\\fR tables\n\
             .TP\n\\fBname\\fR\n\\fIDefault\\fR: none\n.br\nwhat it is: a|b\n"
        );
    }

    /// Trap 9 (man pages), links to .md files: catches a page that sends its reader to a file
    /// an installed system does not have: a link labelled with a doc's file name becomes its
    /// man page or what the doc is in words; one within the page or with a prose label, its label.
    #[test]
    fn links_to_docs_become_man_pages_or_words() {
        assert_eq!(
            roff_of("See [client.md](client.md#metrics), [recovery.md](recovery.md#x), [Keys](#keys) and [the README's example](../README.md#c).\n"),
            ".PP\nSee \\fBrblk\\fR(1), the recovery notes of rblk's documentation, Keys and the README's example.\n"
        );
    }

    /// Catches markdown the renderer would garble passing silently: each is refused with its line.
    #[test]
    fn refuses_what_it_does_not_render() {
        for (md, line, what) in [
            ("text\n\n1. first\n", 3, "a list item"),
            ("- item\n  - nested\n", 2, "nested"),
            ("> quoted\n", 1, "block quote"),
            ("    indented code\n", 1, "indented code block"),
            ("| a |\n| b |\n", 1, "|---|"),
            ("| a | b |\n|---|---|\n| 1 |\n", 3, "1 cells"),
            ("```\nno end\n", 1, "does not end"),
        ] {
            let e = parse(md).unwrap_err();
            assert!(e.starts_with(&format!("line {line}: ")) && e.contains(what), "{md:?}: {e}");
        }
    }
}
