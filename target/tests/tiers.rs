//! The daemon's modules in tiers (docs/DESIGN.md, "The daemon in tiers"), checked on the source.
//!
//! It reads `target/src/*.rs` and collects each module's imports of its sibling modules: `use
//! crate::x`, `crate::x::` paths in code (a `use crate::{x, y}` group too), `super::x` where it
//! names the crate root, and `rblk_target::x` in `main.rs` (the binary, a module of the top tier
//! here). Comments, doc comments (an intra-doc link like [`crate::x`] is not an import) and
//! string and character literals are skipped. So are `#[cfg(test)] mod` blocks: a unit test may
//! build its fixture from any tier; the daemon's structure is the code that ships.
//!
//! It fails on:
//! - an import cycle among the modules (it prints one per strongly connected set);
//! - a module importing a module of a higher tier than its own ([`TIERS`], bottom first);
//! - a driver importing another driver (drivers share only what lies below them);
//! - a module missing from [`TIERS`], or named there but gone from `lib.rs`.
//!
//! What it does not see: a path spelled inside a macro by other means than `crate::`/`$crate::`,
//! and a re-export's origin (`crate::server::Config` counts as importing `server`, as it should).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Each module's tier, bottom first. A module imports only its own tier and those below; a
/// module of [`DRIVERS`] imports no other driver.
const TIERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "access",
            "access_changes",
            "admin_protocol",
            "admission",
            "cli",
            "config",
            "counters",
            "errors",
            "identity",
            "lint",
            "notify",
            "persist",
            "reload",
            "resources",
            "saved",
            "start",
            "uring",
        ],
    ),
    ("core", &["connection", "control", "registry", "session", "volume"]),
    (DRIVERS, &["admin", "handover", "metrics", "worker"]),
    ("top", &["main", "server"]),
];

/// The tier whose modules must not import each other.
const DRIVERS: &str = "drivers";

/// Imports that break the rules, each with why it remains: (from, to, why). They are neither
/// checked against the tiers nor counted in cycles; any other import is. None today: keep it so.
const ALLOWED: &[(&str, &str, &str)] = &[];

#[test]
fn the_daemon_keeps_its_tiers() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut sources: Vec<(String, String)> = declared_modules(&lib)
        .into_iter()
        .map(|m| {
            let text = std::fs::read_to_string(src.join(format!("{m}.rs"))).unwrap();
            (m, text)
        })
        .collect();
    sources.push(("main".to_owned(), std::fs::read_to_string(src.join("main.rs")).unwrap()));
    let problems = check(&sources, TIERS, ALLOWED);
    assert!(problems.is_empty(), "the daemon's tiers are broken:\n  {}", problems.join("\n  "));
}

#[test]
fn the_checker_reports_cycles_upward_imports_and_drivers_importing_drivers() {
    let tiers: &[(&str, &[&str])] = &[("base", &["errors"]), ("core", &["registry"]), (DRIVERS, &["admin", "worker"])];
    let sources = [
        // An upward import, and a cycle with registry's import of admin below.
        ("errors", "use crate::registry::Shared;\n"),
        // Comments, doc links, strings and test modules are not imports.
        (
            "registry",
            "//! See [`crate::worker`].\n\
             use crate::errors::Error; /* crate::worker */\n\
             fn f() -> &'static str { let _ = '\"'; \"crate::worker::x\" }\n\
             fn g() { crate::admin::call(); }\n\
             #[cfg(test)]\nmod tests { use crate::worker::Workers; }\n",
        ),
        // A driver importing another, through a group.
        ("admin", "use crate::{errors::Error, worker};\nfn h() { super::registry::Shared::new(); }\n"),
        ("worker", "pub struct Workers;\n"),
    ];
    let sources: Vec<(String, String)> = sources.iter().map(|(m, s)| (m.to_string(), s.to_string())).collect();
    let problems = check(&sources, tiers, &[]);
    let expected = [
        "errors.rs:1: errors (base) imports registry (core), a higher tier",
        "registry.rs:4: registry (core) imports admin (drivers), a higher tier",
        "admin.rs:1: admin imports worker: drivers import no other driver",
        "cycle: admin -> registry -> admin",
        "cycle: errors -> registry -> errors",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for e in expected {
        assert!(problems.iter().any(|p| p == e), "missing {e:?} in {problems:#?}");
    }
    // An allowed import is not reported, and an allowance nobody needs is.
    let allowed = [("admin", "worker", "test"), ("registry", "admin", "test"), ("errors", "admin", "test")];
    let problems = check(&sources, tiers, &allowed);
    assert!(!problems.iter().any(|p| p.starts_with("admin.rs") || p.starts_with("registry.rs")), "{problems:#?}");
    assert!(problems.iter().any(|p| p.contains("errors -> admin is allowed but not imported")), "{problems:#?}");
    // An allowed import does not close a cycle either.
    assert!(!problems.iter().any(|p| p.contains("cycle: admin")), "{problems:#?}");
}

/// One import of a sibling module: which line of `from` names `to`.
#[derive(Debug)]
struct Import {
    from: String,
    to: String,
    line: usize,
}

/// What breaks the rules in `sources` (module name, its text), one line each.
fn check(sources: &[(String, String)], tiers: &[(&str, &[&str])], allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let tier_of: BTreeMap<&str, usize> =
        tiers.iter().enumerate().flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i))).collect();
    let names: BTreeSet<String> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut problems = Vec::new();
    for m in &names {
        if !tier_of.contains_key(m.as_str()) {
            problems.push(format!("{m} is in no tier: add it to TIERS"));
        }
    }
    for m in tier_of.keys() {
        if !names.contains(*m) {
            problems.push(format!("{m} is in TIERS but not a module of the crate"));
        }
    }
    let imports: Vec<Import> = sources.iter().flat_map(|(m, text)| imports(m, text, &names)).collect();
    // Each (from, to) once, with every line that names it.
    let mut lines: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    for i in &imports {
        lines.entry((i.from.as_str(), i.to.as_str())).or_default().push(i.line.to_string());
    }
    let is_allowed = |f: &str, t: &str| allowed.iter().any(|a| (a.0, a.1) == (f, t));
    for (&(f, t), at) in &lines {
        let (Some(&from), Some(&to)) = (tier_of.get(f), tier_of.get(t)) else { continue };
        let why = if to > from {
            format!("{f} ({}) imports {t} ({}), a higher tier", tiers[from].0, tiers[to].0)
        } else if from == to && tiers[from].0 == DRIVERS {
            format!("{f} imports {t}: drivers import no other driver")
        } else {
            continue;
        };
        if !is_allowed(f, t) {
            problems.push(format!("{f}.rs:{}: {why}", at.join(",")));
        }
    }
    for (f, t, _) in allowed {
        if !lines.contains_key(&(*f, *t)) {
            problems.push(format!("{f} -> {t} is allowed but not imported: drop it from ALLOWED"));
        }
    }
    // Cycles among the imports not allowed.
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = names.iter().map(|m| (m.as_str(), BTreeSet::new())).collect();
    for &(f, t) in lines.keys().filter(|(f, t)| !is_allowed(f, t)) {
        graph.get_mut(f).unwrap().insert(t);
    }
    for cycle in cycles(&graph) {
        problems.push(format!("cycle: {}", cycle.join(" -> ")));
    }
    problems
}

/// The modules `lib.rs` declares (`mod x;`, `pub mod x;`).
fn declared_modules(lib: &str) -> Vec<String> {
    let toks = tokens(&strip(lib));
    let mut out = Vec::new();
    for w in toks.windows(3) {
        if let [(Tok::Ident(m), _), (Tok::Ident(name), _), (Tok::Punct(';'), _)] = w {
            if m == "mod" {
                out.push(name.clone());
            }
        }
    }
    out
}

/// `module`'s imports of the other modules in `names`, one per line and target.
fn imports(module: &str, text: &str, names: &BTreeSet<String>) -> Vec<Import> {
    let toks = without_test_modules(tokens(&strip(text)));
    let mut found: BTreeSet<(String, usize)> = BTreeSet::new();
    // Brace depths at which a nested `mod x {` opened: `super::` inside one names that module's
    // parent, not the crate root.
    let mut mods: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if mods.last() == Some(&depth) {
                    mods.pop();
                }
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some((Tok::Ident(_), _)), Some((Tok::Punct('{'), _))) = (toks.get(i + 1), toks.get(i + 2)) {
                    mods.push(depth);
                }
            }
            Tok::Ident(root)
                if (root == "crate" || root == "rblk_target") && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Sep) =>
            {
                found.extend(first_segments(&toks, i + 2));
            }
            Tok::Ident(root) if root == "super" => {
                // `super::super::x` climbs one module per `super`; the file's module is one.
                let mut j = i;
                while matches!(toks.get(j), Some((Tok::Ident(s), _)) if s == "super")
                    && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Sep)
                {
                    j += 2;
                }
                if (j - i) / 2 == mods.len() + 1 {
                    found.extend(first_segments(&toks, j));
                }
                i = j.max(i + 1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
        .into_iter()
        .filter(|(to, _)| names.contains(to) && to != module)
        .map(|(to, line)| Import { from: module.to_owned(), to, line })
        .collect()
}

/// The first path segments after a `crate::` at `at`: one ident, or each of a `{a, b::c}` group.
fn first_segments(toks: &[(Tok, usize)], at: usize) -> Vec<(String, usize)> {
    match toks.get(at) {
        Some((Tok::Ident(name), line)) => vec![(name.clone(), *line)],
        Some((Tok::Punct('{'), _)) => {
            let mut out = Vec::new();
            let mut depth = 0;
            let mut expect = true;
            for (t, line) in &toks[at..] {
                match t {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Punct(',') if depth == 1 => {
                        expect = true;
                        continue;
                    }
                    Tok::Ident(name) if depth == 1 && expect => out.push((name.clone(), *line)),
                    _ => {}
                }
                expect = false;
            }
            out
        }
        _ => Vec::new(),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

/// `text` as identifiers, `::` and single punctuation characters, each with its line.
fn tokens(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
        }
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((Tok::Sep, line));
            i += 2;
            continue;
        }
        if !c.is_whitespace() && !c.is_numeric() {
            out.push((Tok::Punct(c), line));
        }
        i += 1;
    }
    out
}

/// `toks` without the `#[cfg(test)] mod x { ... }` blocks.
fn without_test_modules(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let ident = |t: Option<&(Tok, usize)>, want: &str| matches!(t, Some((Tok::Ident(s), _)) if s == want);
    let punct = |t: Option<&(Tok, usize)>, want: char| matches!(t, Some((Tok::Punct(c), _)) if *c == want);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = |k: usize| toks.get(i + k);
        let mut j = 7;
        if ident(t(j), "pub") {
            j += 1;
        }
        let test_mod = punct(t(0), '#')
            && punct(t(1), '[')
            && ident(t(2), "cfg")
            && punct(t(3), '(')
            && ident(t(4), "test")
            && punct(t(5), ')')
            && punct(t(6), ']')
            && ident(t(j), "mod")
            && matches!(t(j + 1), Some((Tok::Ident(_), _)))
            && punct(t(j + 2), '{');
        if !test_mod {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        // Past the block's closing brace.
        let mut depth = 0;
        i += j + 2;
        while i < toks.len() {
            match toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                _ => {}
            }
            i += 1;
            if depth == 0 {
                break;
            }
        }
    }
    out
}

/// `text` with comments and string and character literals blanked (newlines kept, for lines).
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[char]| out.extend(s.iter().map(|&ch| if ch == '\n' { '\n' } else { ' ' }));
    let mut i = 0;
    while i < c.len() {
        let start = i;
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            // Block comments nest.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i].is_alphabetic() || c[i] == '_' {
            // An identifier, or the prefix of a raw or byte string (r"", r#""#, br"", b"", c"").
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let raw = matches!(word.as_str(), "r" | "br" | "cr");
            let hashes = if raw { c[i..].iter().take_while(|&&ch| ch == '#').count() } else { 0 };
            if raw && c.get(i + hashes) == Some(&'"') {
                out.push_str(&word);
                let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let body = i;
                i += hashes + 1;
                while i < c.len() && !c[i..].starts_with(&close) {
                    i += 1;
                }
                i = (i + close.len()).min(c.len());
                blank(&mut out, &c[body..i]);
                continue;
            }
            out.push_str(&word);
            continue;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(c.len());
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime or label ('a, 'outer:).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i = (i + 1).min(c.len());
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                out.push('\'');
                i += 1;
                continue;
            }
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        blank(&mut out, &c[start..i]);
    }
    out
}

/// Shortest cycles that together pass through every module on one.
fn cycles<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for &start in graph.keys() {
        if covered.contains(start) {
            continue;
        }
        // Breadth first from `start` back to it.
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        'search: while let Some(m) = queue.pop_front() {
            for &n in &graph[m] {
                if prev.contains_key(n) {
                    continue;
                }
                prev.insert(n, m);
                if n == start {
                    break 'search;
                }
                queue.push_back(n);
            }
        }
        if !prev.contains_key(start) {
            continue;
        }
        // Walked back from `start`: its predecessor first.
        let mut back = Vec::new();
        let mut at = prev[start];
        while at != start {
            back.push(at);
            at = prev[at];
        }
        let cycle: Vec<&str> = std::iter::once(start).chain(back.into_iter().rev()).chain([start]).collect();
        covered.extend(cycle.iter().copied());
        out.push(cycle);
    }
    out
}
