//! `rblk-target.toml(5)`: the config file's man page, rendered from docs/configuration.md (the
//! one place its keys are described) under a NAME, a SYNOPSIS and a SEE ALSO of its own. The
//! tests tie the page's key tables to the keys the daemon's parser accepts, both ways, and to
//! the commented example dist/rblk-target.toml.

use roff::{bold, italic, line_break, roman, Roff};

use crate::markdown;

/// The reference the page is made of.
pub(crate) const CONFIGURATION_MD: &str = include_str!("../../../docs/configuration.md");

/// The page's file name under OUTDIR/man.
pub(crate) const FILE_NAME: &str = "rblk-target.toml.5";

/// The pages SEE ALSO names: rblk-dist writes those of section 1 too (its test checks).
pub(crate) const SEE_ALSO: [&str; 6] = [
    "rblk-target(1)",
    "rblk-target-admin(1)",
    "rblk-target-gen-key(1)",
    "rblk(1)",
    "systemd.service(5)",
    "systemd.exec(5)",
];

/// The page, for rblk-target `version`; an error names the markdown it cannot render.
pub(crate) fn page(version: &str) -> Result<String, String> {
    let blocks = markdown::parse(CONFIGURATION_MD).map_err(|e| format!("docs/configuration.md: {e}"))?;
    // The intro (before the first section) is the DESCRIPTION.
    let split = blocks.iter().position(|b| matches!(b, markdown::Block::Heading { level: 2, .. })).unwrap_or(0);
    let (intro, sections) = blocks.split_at(split);
    let th_version = format!("rblk-target {version}");
    let mut page = Roff::new();
    page.control("TH", ["rblk-target.toml", "5", "\"\"", th_version.as_str(), "File Formats"])
        .control("SH", ["NAME"])
        .text([roman("rblk-target.toml - the configuration file of rblk-target, and its flags")])
        .control("SH", ["SYNOPSIS"])
        .text([bold("/etc/rblk/target.toml"), line_break(), bold("rblk-target --config"), roman(" "), italic("FILE")])
        .control("SH", ["DESCRIPTION"]);
    markdown::render(intro, &mut page);
    markdown::render(sections, &mut page);
    let see_also: Vec<String> = SEE_ALSO.iter().map(|s| (*s).to_owned()).collect();
    page.control("SH", ["SEE ALSO"]).text(crate::man_page::see_also_line(&see_also)?);
    Ok(page.render())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rblk_target::config::{File, FileHost, FileVolume};

    use super::*;
    use crate::markdown::Block;

    /// The keys a config struct accepts, from its own deserializer: serde's deny_unknown_fields
    /// error lists the expected fields (renames applied) when it meets one it does not know.
    fn accepted<T: serde::de::DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
        let e = toml::from_str::<T>("rblk_dist_probe = 0").expect_err("an unknown key is refused").to_string();
        let expected = e.split_once("expected").unwrap_or_else(|| panic!("no expected fields in: {e}")).1;
        let keys: BTreeSet<String> = expected.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        assert!(!keys.is_empty(), "no keys in: {e}");
        keys
    }

    /// (table, key) for every key the daemon's config file parser takes; "" is the top level,
    /// whose `host` and `volume` are the `[[host]]` and `[[volume]]` tables.
    fn parser_keys() -> BTreeSet<(String, String)> {
        let top = accepted::<File>();
        assert!(top.contains("listen") && top.contains("volume"), "{top:?}");
        let mut all: BTreeSet<(String, String)> = top.iter().map(|k| (String::new(), k.clone())).collect();
        all.extend(accepted::<FileHost>().into_iter().map(|k| ("host".to_owned(), k)));
        all.extend(accepted::<FileVolume>().into_iter().map(|k| ("volume".to_owned(), k)));
        all
    }

    /// (table, key) for every key docs/configuration.md's "The config file" section documents:
    /// the first cell of its tables' rows, `[[X]]` in a subsection's heading making X a table
    /// (and a key of the top level).
    fn documented_keys() -> BTreeSet<(String, String)> {
        let blocks = markdown::parse(CONFIGURATION_MD).unwrap();
        let start = blocks
            .iter()
            .position(|b| matches!(b, Block::Heading { level: 2, text } if text == "The config file"))
            .expect("docs/configuration.md has a section '## The config file'");
        let mut table = String::new();
        let mut keys = BTreeSet::new();
        for block in &blocks[start + 1..] {
            match block {
                Block::Heading { level: 2, .. } => break,
                Block::Heading { text, .. } => {
                    let name = text.split_once("[[").and_then(|(_, r)| r.split_once("]]")).map(|(n, _)| n);
                    table = name.unwrap_or_else(|| panic!("subsection {text:?} names no [[table]]")).to_owned();
                    keys.insert((String::new(), table.clone()));
                }
                Block::Table { rows, .. } => {
                    for row in rows {
                        let key = row[0].strip_prefix('`').and_then(|k| k.strip_suffix('`'));
                        let key = key.unwrap_or_else(|| panic!("{:?}: the first cell is not a `key`", row[0]));
                        assert!(keys.insert((table.clone(), key.to_owned())), "{table}.{key} documented twice");
                    }
                }
                _ => {}
            }
        }
        keys
    }

    /// Catches the page and the parser drifting apart: a key added to (or renamed in) the
    /// config structs of target/src/config.rs without a row in docs/configuration.md's key
    /// tables, or a row for a key the parser refuses; and a row that does not reach the page.
    #[test]
    fn the_page_documents_every_key_the_parser_accepts_and_no_other() {
        let (parser, documented) = (parser_keys(), documented_keys());
        let show = |s: Vec<&(String, String)>| -> Vec<String> {
            s.iter().map(|(t, k)| if t.is_empty() { k.clone() } else { format!("[[{t}]] {k}") }).collect()
        };
        let undocumented = show(parser.difference(&documented).collect());
        let unknown = show(documented.difference(&parser).collect());
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "docs/configuration.md, section 'The config file': keys the parser takes but no table row \
             documents: {undocumented:?}; rows for keys the parser refuses: {unknown:?}"
        );
        let page = page("0").unwrap();
        for (table, key) in &parser {
            let tag = if table.is_empty() && (key == "host" || key == "volume") {
                format!(".SS\n\\fB[[{key}]]\\fR")
            } else {
                format!(".TP\n\\fB{}\\fR\n", key.replace('-', "\\-"))
            };
            assert!(page.contains(&tag), "the page has no {tag:?}");
        }
    }

    /// Catches a key missing from the commented example installed as /etc/rblk/target.toml:
    /// every key the parser takes appears in dist/rblk-target.toml as `key =` (commented out
    /// or not), the tables as `[[host]]` and `[[volume]]`.
    #[test]
    fn the_example_config_shows_every_key() {
        let example = include_str!("../../rblk-target.toml");
        let lines: Vec<&str> = example.lines().map(|l| l.trim_start_matches(['#', ' '])).collect();
        for (table, key) in parser_keys() {
            let shown = if table.is_empty() && (key == "host" || key == "volume") {
                lines.contains(&format!("[[{key}]]").as_str())
            } else {
                lines.iter().any(|l| l.strip_prefix(key.as_str()).is_some_and(|r| r.trim_start().starts_with('=')))
            };
            assert!(shown, "dist/rblk-target.toml does not show {table} {key}");
        }
    }

    /// Catches a page man cannot show: groff reads it without a warning (-ww), and it is a
    /// section-5 page with every part a reader looks for.
    #[test]
    fn groff_reads_the_page_without_warnings() {
        let text = page(env!("CARGO_PKG_VERSION")).unwrap();
        for part in [".TH rblk-target.toml 5", ".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH \"SEE ALSO\""] {
            assert!(text.contains(part), "no {part:?} in the page");
        }
        assert!(text.contains("\\fBrblk\\-target\\fR(1)"), "SEE ALSO names rblk-target(1)");
        // Trap 9 (man pages): an installed system has no docs/*.md to be sent to.
        assert!(!text.contains(".md"), "the page names a .md file");
        let path = std::env::temp_dir().join(format!("rblk-dist-page-{}.5", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let out = std::process::Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&path)
            .output()
            .expect("running groff (Debian's groff-base, which man-db needs)");
        std::fs::remove_file(&path).unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "groff: {}", String::from_utf8_lossy(&out.stderr));
    }
}
