//! The README's walk-through of files, run as written against a real server: upload a
//! CSV, run a program on it, download its output, then chart the same upload with pandas
//! and matplotlib and download the PNG. Keeps the README's commands true.
//!
//! Needs curl and the managed Python runtime (`.ci/run` installs both).

use crate::common::Server;

/// The shell blocks of README.md from "A small CSV to work with" to "The other file
/// routes", in order.
fn walkthrough() -> String {
    let readme = include_str!("../../../../README.md");
    let start = readme
        .find("A small CSV to work with")
        .expect("README: the files walk-through moved");
    let end = start
        + readme[start..]
            .find("The other file routes")
            .expect("README: its end moved");
    let mut script = String::new();
    let mut inside = false;
    for line in readme[start..end].lines() {
        if line.starts_with("```") {
            inside = line == "```sh";
            continue;
        }
        if inside {
            script.push_str(line);
            script.push('\n');
        }
    }
    script
}

#[test]
fn the_readme_uploads_a_csv_and_gets_a_chart_back() {
    let script = walkthrough();
    assert!(
        script.contains("plot_0.png") && script.contains("chart.png"),
        "{script}"
    );
    let s = Server::start();
    let url = s.url("/v1");
    let script = script.replace("URL=http://127.0.0.1:3112/v1", &format!("URL={url}"));
    assert!(
        script.contains(&url),
        "the README no longer sets URL as expected:\n{script}"
    );
    let dir = Server::new_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&dir)
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the README's commands failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The report downloaded as the README says, and the chart is a PNG.
    assert!(stdout.contains("north 165\nsouth 80\n"), "{stdout}");
    let png = std::fs::read(dir.join("chart.png")).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "chart.png is not a PNG ({} bytes)",
        png.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_readmes_npm_example_prints_what_it_says() {
    let readme = include_str!("../../../../README.md");
    let at = readme
        .find("Programs can import the pinned npm packages")
        .expect("README: the npm example moved");
    let block = &readme[at..];
    let start = block.find("```sh\n").unwrap() + "```sh\n".len();
    let command = &block[start..start + block[start..].find("```").unwrap()];
    let said = block
        .split("The response has `\"stdout\": ")
        .nth(1)
        .and_then(|t| t.split('`').next())
        .expect("README: the npm example's answer moved");
    let want: String = serde_json::from_str(said).expect("the README's stdout is a JSON string");
    let s = crate::node::node_server(0);
    let base = s.url("");
    let out = std::process::Command::new("bash")
        .args([
            "-euo",
            "pipefail",
            "-c",
            &command.replace("http://127.0.0.1:3112", &base),
        ])
        .output()
        .expect("run bash");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON answer");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], want.as_str(), "{r}");
}
