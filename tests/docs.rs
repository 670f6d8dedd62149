//! Docs that stay true: every `bnn …` command shown in the README and the guide parses with
//! the binary's own parser (each is run with `--help` appended, which makes clap check every
//! flag and value before it, then stop), every `--flag` they name exists, every relative
//! link and anchor in the documents resolves, the README stays within 250 lines, and the
//! user documents carry no development log (issue numbers, sessions). The planted-error
//! tests at the end prove each check can fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Documents whose commands and flags are checked.
const COMMAND_DOCS: [&str; 2] = ["README.md", "docs/guide.md"];
/// Documents whose links are checked and which must not read as a work log.
const USER_DOCS: [&str; 6] = [
    "README.md",
    "docs/guide.md",
    "docs/BENCHMARKS.md",
    "docs/DESIGN.md",
    "docs/python.md",
    "docs/SCALING.md",
];
const README_MAX_LINES: usize = 250;
/// Flags of the other programs the documents show (cargo, mpirun).
const OTHER_TOOLS_FLAGS: [&str; 9] = [
    "--release",
    "--features",
    "--path",
    "--test",
    "--lib",
    "--no-default-features",
    "--all-targets",
    "--hostfile",
    "--example",
];

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `sh` code blocks of a Markdown text, continuation lines joined, with the line number
/// each command starts on.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let (mut in_sh, mut in_other) = (false, false);
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            if in_sh || in_other {
                in_sh = false;
                in_other = false;
            } else if lang.trim() == "sh" || lang.trim() == "bash" {
                in_sh = true;
            } else {
                in_other = true;
            }
            continue;
        }
        if !in_sh {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push_str(line.trim());
        match joined.strip_suffix('\\') {
            Some(head) => pending = Some((start, format!("{} ", head.trim_end()))),
            None => out.push((start, joined)),
        }
    }
    out
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut in_block = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block {
            out.push((i + 1, line));
        }
    }
    out
}

/// Inline code spans of a text that show a whole command (`bnn train --x`), skipping usage
/// synopses (`[--flag]`, `a|b`, `…`).
fn inline_commands(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        for (k, span) in line.split('`').enumerate() {
            let is_code = k % 2 == 1;
            let shows_command = span.starts_with("bnn ") || span.starts_with("mpirun ");
            if is_code && shows_command && !span.contains(['[', '|', '…']) {
                out.push((n, span.to_string()));
            }
        }
    }
    out
}

/// Splits a shell line into words (single and double quotes; no expansions), dropping a
/// trailing comment.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quote, mut has) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                has = true;
            }
            (None, '#') if !has && cur.is_empty() => break,
            (None, c) if c.is_whitespace() => {
                if has || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                has = false;
            }
            (None, c) => {
                cur.push(c);
                has = true;
            }
        }
    }
    if has || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The arguments of each `bnn` invocation in a shell line: the program is `bnn`, a path
/// ending in `/bnn`, or `cargo run --release --`, first in its `&&`/`;`/`|` segment or after
/// `mpirun` and its options. Redirections are dropped.
fn bnn_invocations(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for segment in line
        .split("&&")
        .flat_map(|s| s.split(';'))
        .flat_map(|s| s.split('|'))
    {
        let w = words(segment);
        let start = match w.first().map(String::as_str) {
            Some("mpirun") => w.iter().position(|t| t == "bnn" || t.ends_with("/bnn")),
            Some(t) if t == "bnn" || t.ends_with("/bnn") => Some(0),
            Some("cargo") if w.len() > 3 && w[1..4] == ["run", "--release", "--"] => Some(3),
            _ => None,
        };
        let Some(start) = start else { continue };
        let mut args = Vec::new();
        let mut rest = w[start + 1..].iter();
        while let Some(a) = rest.next() {
            if a == ">" || a == "2>" || a == "<" {
                rest.next();
            } else if !(a.starts_with('>') || a.starts_with("2>")) {
                args.push(a.clone());
            }
        }
        out.push(args);
    }
    out
}

/// Why `bnn ARGS --help` does not parse, if it does not.
fn parse_error(args: &[String]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run bnn");
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// Every long flag the binary knows, over all its subcommands, and those of the Python and
/// shell scripts in `bench/` and `scripts/`.
fn known_flags() -> BTreeSet<String> {
    let mut flags: BTreeSet<String> = OTHER_TOOLS_FLAGS.iter().map(|s| s.to_string()).collect();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let out = Command::new(env!("CARGO_BIN_EXE_bnn"))
            .args(&path)
            .arg("--help")
            .output()
            .expect("run bnn");
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        flags.extend(flag_tokens(&help));
        let mut in_commands = false;
        for line in help.lines() {
            if line.starts_with("Commands:") {
                in_commands = true;
            } else if in_commands && line.starts_with("  ") {
                let name = line.split_whitespace().next().unwrap_or("");
                if name != "help" {
                    todo.push(path.iter().cloned().chain([name.to_string()]).collect());
                }
            } else {
                in_commands = false;
            }
        }
    }
    for dir in ["bench", "scripts"] {
        for entry in std::fs::read_dir(Path::new(ROOT).join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "py" || e == "sh") {
                flags.extend(flag_tokens(&std::fs::read_to_string(path).unwrap()));
            }
        }
    }
    flags
}

/// The `--long-flag` tokens of a text (not inside a longer word or a URL).
fn flag_tokens(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let boundary =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-' || b[i - 1] == b'/');
        if boundary && b[i] == b'-' && b[i + 1] == b'-' && b[i + 2].is_ascii_lowercase() {
            let mut j = i + 2;
            while j < b.len()
                && (b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'-')
            {
                j += 1;
            }
            out.push(text[i..j].trim_end_matches('-').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Problems with the commands and flags of one document.
fn command_problems(name: &str, text: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut shown = shell_lines(text);
    shown.extend(inline_commands(text));
    for (line, cmd) in shown {
        for args in bnn_invocations(&cmd) {
            if let Some(e) = parse_error(&args) {
                let first = e.lines().next().unwrap_or("");
                problems.push(format!(
                    "{name}:{line}: `bnn {}` does not parse: {first}",
                    args.join(" ")
                ));
            }
        }
    }
    for flag in flag_tokens(text).into_iter().collect::<BTreeSet<_>>() {
        if !known.contains(&flag) {
            problems.push(format!("{name}: names {flag}, which no command has"));
        }
    }
    problems
}

/// GitHub's anchor of a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .into_iter()
        .filter(|(_, line)| line.starts_with('#'))
        .map(|(_, line)| slug(line.trim_start_matches('#')))
        .collect()
}

/// Broken relative links and anchors of the document at `path` (relative to the root).
fn link_problems(path: &str, text: &str) -> Vec<String> {
    let dir: PathBuf = Path::new(ROOT).join(path).parent().unwrap().to_path_buf();
    let mut problems = Vec::new();
    for (n, line) in prose_lines(text) {
        for part in line.split("](").skip(1) {
            let Some(target) = part.split(')').next() else {
                continue;
            };
            let target = target.split_whitespace().next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let file_path = if file.is_empty() {
                Path::new(ROOT).join(path)
            } else {
                dir.join(file)
            };
            if !file_path.exists() {
                problems.push(format!("{path}:{n}: link to {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() && file_path.extension().is_some_and(|e| e == "md") {
                let linked = std::fs::read_to_string(&file_path).unwrap();
                if !anchors(&linked).contains(anchor) {
                    problems.push(format!("{path}:{n}: link to {target}: no such heading"));
                }
            }
        }
    }
    problems
}

/// Words of a development log in a user document.
fn log_words(path: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let issue_number = lower.match_indices("issue").any(|(i, _)| {
            let rest = lower[i + 5..].trim_start_matches([' ', '#']);
            rest.starts_with(|c: char| c.is_ascii_digit())
        });
        let session = lower
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w == "session" || w == "sessions");
        if issue_number || session {
            problems.push(format!(
                "{path}:{}: reads as a work log: {}",
                n + 1,
                line.trim()
            ));
        }
    }
    problems
}

fn readme_length_problem(text: &str) -> Option<String> {
    let n = text.lines().count();
    (n > README_MAX_LINES).then(|| format!("README.md has {n} lines, more than {README_MAX_LINES}"))
}

#[test]
fn commands_and_flags_shown_in_the_docs_parse() {
    let known = known_flags();
    let problems: Vec<String> = COMMAND_DOCS
        .iter()
        .flat_map(|doc| command_problems(doc, &read(doc), &known))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The check saw the commands it is meant to see.
    let readme = read("README.md");
    let shown: Vec<_> = shell_lines(&readme)
        .into_iter()
        .flat_map(|(_, l)| bnn_invocations(&l))
        .collect();
    assert!(shown.contains(&vec!["train".to_string()]), "{shown:?}");
}

#[test]
fn links_resolve_and_user_docs_are_not_a_work_log() {
    let mut problems = Vec::new();
    for doc in USER_DOCS {
        let text = read(doc);
        problems.extend(link_problems(doc, &text));
        problems.extend(log_words(doc, &text));
    }
    problems.extend(readme_length_problem(&read("README.md")));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_planted_stale_flag_fails_the_check() {
    let known = known_flags();
    let planted = format!(
        "{}\n```sh\nbnn train --learning-rate 0.1\n```\n",
        read("README.md")
    );
    let problems = command_problems("README.md", &planted, &known);
    assert!(
        problems.iter().any(|p| p.contains("does not parse")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("names --learning-rate")),
        "{problems:?}"
    );
    // In prose and in an inline command too.
    let inline = "Run `bnn eval --run r --ood fashion-mnist` to score it.";
    assert_eq!(command_problems("x.md", inline, &known).len(), 2);
    // A wrong value of a known flag.
    let value = "```sh\nbnn train --sampler nuts\n```\n";
    assert_eq!(command_problems("x.md", value, &known).len(), 1);
}

#[test]
fn a_planted_broken_link_fails_the_check() {
    let planted = format!(
        "{}\nSee [the FAQ](docs/faq.md) and [flags](docs/guide.md#no-such-heading).\n",
        read("README.md")
    );
    let problems = link_problems("README.md", &planted);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(readme_length_problem(&"line\n".repeat(251)).is_some());
    assert_eq!(
        log_words("x.md", "Fixed in issue 36, see the third session.").len(),
        1
    );
}

#[test]
fn shell_words_and_invocations() {
    assert_eq!(
        words(r#"bnn bench train --hidden "" --batch 128  # comment"#),
        ["bnn", "bench", "train", "--hidden", "", "--batch", "128"]
    );
    let line =
        "git clone x bnn && cd bnn && mpirun -n 2 target/release/bnn train --chains 4 > log 2>&1";
    assert_eq!(
        bnn_invocations(line),
        vec![vec!["train".to_string(), "--chains".into(), "4".into()]]
    );
    assert_eq!(
        bnn_invocations("cargo run --release -- train"),
        vec![vec!["train".to_string()]]
    );
    assert_eq!(slug("`bnn train`"), "bnn-train");
    assert_eq!(slug("Several processes: MPI"), "several-processes-mpi");
}
