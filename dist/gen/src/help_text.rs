//! The commands' help texts (clap's `long_about`, `after_long_help`, an option's `long_help`)
//! as a man page shows them: paragraphs filled, indented blocks kept as written, an indented
//! two-column block (a field and what it means, as bench/src/json.md lays out fio's JSON) as a
//! list of tagged paragraphs, and an "Examples:" paragraph with what follows it taken out for
//! the page's EXAMPLES section, each command in `.EX`/`.EE`.

use roff::{bold, roman, Inline, Roff};

/// A block of a help text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    /// Lines without indentation, up to a blank or an indented line, joined with spaces.
    Paragraph(String),
    /// Lines indented by two spaces or more, without their common indentation.
    Indented(Vec<String>),
}

/// Parses a help text into blocks.
pub(crate) fn parse(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        match blocks.last_mut() {
            _ if line.trim().is_empty() => blocks.push(None),
            Some(Some(Block::Indented(lines))) if indent >= 2 => lines.push(line.trim_end().to_owned()),
            Some(Some(Block::Paragraph(text))) if indent < 2 => {
                text.push(' ');
                text.push_str(line.trim());
            }
            _ if indent >= 2 => blocks.push(Some(Block::Indented(vec![line.trim_end().to_owned()]))),
            _ => blocks.push(Some(Block::Paragraph(line.trim().to_owned()))),
        }
    }
    blocks
        .into_iter()
        .flatten()
        .map(|b| match b {
            Block::Indented(lines) => {
                let cut = lines.iter().map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
                Block::Indented(lines.into_iter().map(|l| l[cut..].to_owned()).collect())
            }
            other => other,
        })
        .collect()
}

/// Splits `blocks` into the description and the examples: a paragraph that is (or ends with)
/// "Examples:" starts them; they go on while indented blocks follow, and a paragraph followed
/// by one (the prose between two examples); the first paragraph after them that introduces no
/// example goes back to the description, with everything after it.
pub(crate) fn split_examples(blocks: Vec<Block>) -> (Vec<Block>, Vec<Block>) {
    let (mut description, mut examples) = (Vec::new(), Vec::new());
    let mut iter = blocks.into_iter().peekable();
    while let Some(block) = iter.next() {
        let intro = match &block {
            Block::Paragraph(text) => examples_heading(text),
            Block::Indented(_) => None,
        };
        let Some(before) = intro else {
            description.push(block);
            continue;
        };
        if !matches!(iter.peek(), Some(Block::Indented(_))) {
            // "Examples:" with no example under it: prose after all.
            description.push(block);
            continue;
        }
        if !before.is_empty() {
            description.push(Block::Paragraph(before));
        }
        loop {
            match iter.peek() {
                Some(Block::Indented(_)) => examples.extend(iter.next()),
                Some(Block::Paragraph(_)) => {
                    let mut ahead = iter.clone();
                    ahead.next();
                    if matches!(ahead.peek(), Some(Block::Indented(_))) {
                        examples.extend(iter.next());
                    } else {
                        break;
                    }
                }
                None => break,
            }
        }
    }
    (description, examples)
}

/// The prose before "Examples:" when `text` is or ends with it.
fn examples_heading(text: &str) -> Option<String> {
    let text = text.trim_end();
    ["Examples:", "Example:", "EXAMPLES:", "For example:"]
        .iter()
        .find_map(|h| text.strip_suffix(h))
        .filter(|before| before.is_empty() || before.ends_with(' '))
        .map(|before| before.trim_end().to_owned())
}

/// Inline text: `code` in backticks bold, the rest roman.
pub(crate) fn inlines(text: &str) -> Vec<Inline> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        let Some(len) = rest[start + 1..].find('`') else { break };
        if start > 0 {
            out.push(roman(&rest[..start]));
        }
        out.push(bold(&rest[start + 1..start + 1 + len]));
        rest = &rest[start + 2 + len..];
    }
    if !rest.is_empty() {
        out.push(roman(rest));
    }
    out
}

/// Renders `blocks` into `page`: the first paragraph with `first` (`PP` in a section, `IP` in an
/// option's tagged paragraph, empty to continue a tagged paragraph's body), the later ones with
/// `PP` or `IP` alike.
pub(crate) fn render(blocks: &[Block], page: &mut Roff, first: &str) {
    let later = if first == "PP" { "PP" } else { "IP" };
    for (n, block) in blocks.iter().enumerate() {
        let macro_name = if n == 0 { first } else { later };
        if !macro_name.is_empty() {
            page.control(macro_name, []);
        }
        match block {
            Block::Paragraph(text) => {
                page.text(inlines(text));
            }
            Block::Indented(lines) => match definitions(lines) {
                // In an option's tagged paragraph, indented under it.
                Some(entries) if later == "IP" => {
                    page.control("RS", []);
                    render_definitions(&entries, page);
                    page.control("RE", []);
                }
                Some(entries) => render_definitions(&entries, page),
                None => example(lines, page),
            },
        }
    }
}

/// Renders the EXAMPLES section's blocks: prose as paragraphs, each indented block in
/// `.EX`/`.EE` as written.
pub(crate) fn render_examples(blocks: &[Block], page: &mut Roff) {
    for block in blocks {
        match block {
            Block::Paragraph(text) => {
                page.control("PP", []).text(inlines(text));
            }
            Block::Indented(lines) => {
                page.control("PP", []);
                example(lines, page);
            }
        }
    }
}

/// Lines in `.EX`/`.EE` (no fill, a fixed-width font), indented.
fn example(lines: &[String], page: &mut Roff) {
    page.control("RS", ["4"]).control("EX", []);
    for line in lines {
        page.text([roman(line.as_str())]);
    }
    page.control("EE", []).control("RE", []);
}

/// An entry of an indented two-column block: its depth (0, or 1 for an entry indented under
/// the one before), its field (None for a line of prose) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Definition {
    pub(crate) depth: usize,
    pub(crate) term: Option<String>,
    pub(crate) text: String,
}

/// `lines` as a two-column block, if they are one: most lines that start left of one column
/// (the one most of them resume at after a gap of two spaces or more) have their field, a gap
/// and their text there, or only a field, whose text follows at that column; lines starting at
/// or right of the column continue the text before.
pub(crate) fn definitions(lines: &[String]) -> Option<Vec<Definition>> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    // Where a line's text resumes after its first gap of two spaces or more.
    let gap = |l: &str| -> Option<usize> {
        let start = indent(l);
        let at = l[start..].find("  ")? + start;
        Some(at + l[at..].len() - l[at..].trim_start().len())
    };
    let mut counts = std::collections::BTreeMap::new();
    for l in lines {
        if let Some(c) = gap(l) {
            *counts.entry(c).or_insert(0) += 1;
        }
    }
    let (&column, &tagged) = counts.iter().max_by_key(|(c, n)| (**n, std::cmp::Reverse(**c)))?;
    let left: Vec<&String> = lines.iter().filter(|l| indent(l) < column).collect();
    if tagged < 2 || tagged * 2 < left.len() {
        return None;
    }
    // Commands with their comments aligned are examples, not fields.
    if lines.iter().any(|l| gap(l).is_some_and(|c| l[c..].starts_with('#'))) {
        return None;
    }
    let base = lines.iter().map(|l| indent(l)).min().unwrap_or(0);
    let mut out: Vec<Definition> = Vec::new();
    for (n, l) in lines.iter().enumerate() {
        let depth = usize::from(indent(l) > base);
        // A field too wide for its column has its text on the next lines.
        let text_below = lines.get(n + 1).is_some_and(|next| indent(next) >= column && gap(next) != Some(column));
        let join = |d: &mut Definition, text: &str| {
            if !d.text.is_empty() {
                d.text.push(' ');
            }
            d.text.push_str(text.trim());
        };
        if gap(l) == Some(column) {
            let (term, text) = l.split_at(column);
            out.push(Definition { depth, term: Some(term.trim().to_owned()), text: text.trim().to_owned() });
        } else if indent(l) >= column {
            join(out.last_mut()?, l);
        } else if text_below {
            out.push(Definition { depth, term: Some(l.trim().to_owned()), text: String::new() });
        } else if out.last().is_some_and(|d| d.term.is_none() && d.depth == depth) {
            // Prose going on at its own indentation.
            join(out.last_mut()?, l);
        } else if l.len() < column {
            out.push(Definition { depth, term: Some(l.trim().to_owned()), text: String::new() });
        } else {
            out.push(Definition { depth, term: None, text: l.trim().to_owned() });
        }
    }
    Some(out)
}

/// Tagged paragraphs, the field bold; a deeper entry indented under the one before.
fn render_definitions(entries: &[Definition], page: &mut Roff) {
    let mut depth = 0;
    for (n, d) in entries.iter().enumerate() {
        while depth < d.depth {
            page.control("RS", []);
            depth += 1;
        }
        while depth > d.depth {
            page.control("RE", []);
            depth -= 1;
        }
        match &d.term {
            Some(term) => {
                page.control("TP", []).text([bold(term.as_str())]);
            }
            None if n == 0 => {}
            None => {
                page.control("IP", []);
            }
        }
        if !d.text.is_empty() {
            page.text(inlines(&d.text));
        }
    }
    while depth > 0 {
        page.control("RE", []);
        depth -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trap 9 (man pages), the examples: catches an "Examples:" paragraph left in the
    /// description (reflowed there) and prose that is not an example taken with them.
    #[test]
    fn examples_are_taken_out_with_the_prose_between_them() {
        let text = "Does a thing.\n\nExamples:\n  rblk a   # one\n  rblk b\n\nThen, on another host:\n  \
                    rblk c\n\nNeeds root.";
        let (description, examples) = split_examples(parse(text));
        assert_eq!(description, [Block::Paragraph("Does a thing.".into()), Block::Paragraph("Needs root.".into())]);
        assert_eq!(
            examples,
            [
                Block::Indented(vec!["rblk a   # one".into(), "rblk b".into()]),
                Block::Paragraph("Then, on another host:".into()),
                Block::Indented(vec!["rblk c".into()]),
            ]
        );
        let mut page = Roff::new();
        render_examples(&examples, &mut page);
        assert_eq!(
            page.to_roff(),
            ".PP\n.RS 4\n.EX\nrblk a   # one\nrblk b\n.EE\n.RE\n.PP\nThen, on another host:\n.PP\n.RS 4\n.EX\nrblk c\n.EE\n.RE\n"
        );
    }

    /// Trap 9 (man pages), the table under EXTRA: catches fio's JSON fields (bench/src/json.md's
    /// layout) rendered as filled text or as one preformatted block instead of a field per
    /// tagged paragraph, with nested fields indented and prose kept as prose.
    #[test]
    fn a_two_column_block_is_a_list_of_fields() {
        let text = "    \"fio version\"   \"rblk-bench-VERSION\"\n    timestamp, time\n                    the end, \
                    in\n                    UTC\n    jobs            one entry per job:\n      jobname       its \
                    name\n    Not written (no such figure): iodepth_level,\n    latency_window.\n    rblk            \
                    its own";
        let [Block::Indented(lines)] = &parse(text)[..] else { panic!("one indented block") };
        let d = |depth, term: Option<&str>, text: &str| Definition {
            depth,
            term: term.map(str::to_owned),
            text: text.to_owned(),
        };
        assert_eq!(
            definitions(lines).unwrap(),
            [
                d(0, Some("\"fio version\""), "\"rblk-bench-VERSION\""),
                d(0, Some("timestamp, time"), "the end, in UTC"),
                d(0, Some("jobs"), "one entry per job:"),
                d(1, Some("jobname"), "its name"),
                d(0, None, "Not written (no such figure): iodepth_level, latency_window."),
                d(0, Some("rblk"), "its own"),
            ]
        );
        let command = ["rblk mount rblk://h/v /mnt   # prints /mnt/v".to_owned(), "mkfs.ext4 /dev/loop0".to_owned()];
        assert_eq!(definitions(&command), None, "one gap is an example, not a table");
        let commented = ["rblk a x   # prints 1", "rblk b     # prints 2", "mkfs.ext4 /dev/loop0"].map(str::to_owned);
        assert_eq!(definitions(&commented), None, "commands with aligned comments are examples, not a table");
    }
}
