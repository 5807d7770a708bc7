//! Every relative link in README.md and docs/*.md resolves: the file it
//! names exists, and a `#anchor` is a heading of that file (GitHub's anchor
//! rule: lower case, punctuation other than `-` and `_` dropped, spaces
//! made `-`, a repeated heading numbered `-1`, `-2`, …). Links with a
//! scheme (`https:`, `mailto:`) are not followed: no network.
//!
//! Rules kept here: headings and links inside fenced code blocks are not
//! headings or links; inline code spans are not links.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// GitHub's anchor for a heading's text.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown text's headings give, duplicates numbered.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let mut candidate = base.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// The targets of the inline links `[text](target)` of a text, outside
/// code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Drop code spans: what is between backticks is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// What is wrong with each relative link of `file`, one line each.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut broken = Vec::new();
    for target in link_targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((path, fragment)) => (path, Some(fragment)),
            None => (target.as_str(), None),
        };
        let linked = if path.is_empty() { file.to_owned() } else { file.parent().unwrap().join(path) };
        if !linked.exists() {
            broken.push(format!("{}: `{target}`: no file {}", file.display(), linked.display()));
            continue;
        }
        if let Some(fragment) = fragment {
            let linked_text = std::fs::read_to_string(&linked).unwrap_or_default();
            if !anchors(&linked_text).contains(fragment) {
                broken.push(format!(
                    "{}: `{target}`: {} has no heading `#{fragment}`",
                    file.display(),
                    linked.display()
                ));
            }
        }
    }
    broken
}

fn documentation_files() -> Vec<PathBuf> {
    let root = repository_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let files = documentation_files();
    assert!(files.len() > 10, "docs/ lost its files: {files:?}");
    let broken: Vec<String> = files.iter().flat_map(|file| broken_links(file)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_docs_file() {
    let readme = std::fs::read_to_string(repository_root().join("README.md")).unwrap();
    let linked: HashSet<String> =
        link_targets(&readme).into_iter().map(|t| t.split('#').next().unwrap().to_owned()).collect();
    for file in documentation_files().iter().skip(1) {
        let name = format!("docs/{}", file.file_name().unwrap().to_string_lossy());
        assert!(linked.contains(&name), "README.md's contents do not link {name}");
    }
}

#[test]
fn the_checker_finds_a_missing_file_and_a_missing_heading() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.md"), "# B title\n\n## Settings: flags, `waku.toml`\n\n## Twice\n\n## Twice\n")
        .unwrap();
    let a = dir.path().join("a.md");
    std::fs::write(
        &a,
        "# A\n[ok](b.md#settings-flags-wakutoml) [ok](b.md#twice-1) [ok](#a) [web](https://example.com/x)\n\
         `[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n\
         [gone](c.md) [bad](b.md#no-such) [bad](#nothing)\n",
    )
    .unwrap();
    let broken = broken_links(&a);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("`c.md`: no file"), "{broken:#?}");
    assert!(broken[1].contains("has no heading `#no-such`"), "{broken:#?}");
    assert!(broken[2].contains("has no heading `#nothing`"), "{broken:#?}");
}
