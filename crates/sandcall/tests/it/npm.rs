//! The pinned npm set for programs (runtimes/npm) over HTTP: every package imports with
//! `import` and `require` in JavaScript and TypeScript, warm and cold, plain and
//! programmatic; a few compute known answers; the set is read-only in the sandbox; and
//! `GET /v1/runtimes` and `doctor` list it.
//!
//! These tests need the set that `.ci/run` installs (`sandcall runtime install` into
//! SANDCALL_RUNTIME_DIR, default `target/runtimes`): without it they fail, loudly.

use crate::common::{runtime_dir, Server};
use crate::files::{download_output, Client};
use crate::node::node_server;
use serde_json::{json, Value};
use std::process::Command;

/// The top-level packages and versions of runtimes/npm/package.json.
fn pinned() -> Vec<(String, String)> {
    let manifest: Value = serde_json::from_str(include_str!("../../../../runtimes/npm/package.json")).unwrap();
    manifest["dependencies"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// The npm set as GET /v1/runtimes says; fails when the server has none.
fn require_set(s: &Server) -> Value {
    let reply = Client::anonymous(s).get("/v1/runtimes");
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    let found = v["runtimes"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["language"] == "javascript").cloned());
    found.unwrap_or_else(|| {
        panic!(
            "no npm set in {}: install it with `sandcall runtime install` and SANDCALL_RUNTIME_DIR \
             set to that directory (.ci/run does): {v}",
            runtime_dir().display()
        )
    })
}

/// A program that imports every package of the set and prints how many it loaded.
fn import_all(style: &str) -> String {
    let mut code = String::new();
    let names = pinned();
    for (i, (name, _)) in names.iter().enumerate() {
        match style {
            "import" => code.push_str(&format!("import * as m{i} from '{name}';\n")),
            _ => code.push_str(&format!("const m{i} = require('{name}');\n")),
        }
    }
    code.push_str("const loaded = [");
    for i in 0..names.len() {
        code.push_str(&format!("m{i}, "));
    }
    code.push_str("].filter((m) => m && (typeof m === 'object' || typeof m === 'function')).length;\n");
    code.push_str("console.log('loaded', loaded);\n");
    code
}

#[test]
fn every_package_imports_in_js_and_ts_warm_and_cold() {
    let s = node_server(1);
    let set = require_set(&s);
    let n = pinned().len();
    let want = format!("loaded {n}\n");
    for lang in ["js", "ts"] {
        for style in ["import", "require"] {
            let code = import_all(style);
            for cold in [false, true] {
                s.wait_warm(2);
                let mut body = json!({"lang": lang, "code": code});
                if cold {
                    // Limits other than the defaults take the cold path.
                    body["limits"] = json!({"memory_limit_mb": 500});
                }
                let (kind, r) = s.exec_kind(&body.to_string());
                assert_eq!(kind, if cold { "cold" } else { "warm" }, "{r}");
                assert_eq!(r["status"], "ok", "{lang} {style} {kind}: {r}");
                assert_eq!(r["stdout"], want, "{lang} {style} {kind}: {r}");
                assert_eq!(r["stderr"], "", "{lang} {style} {kind}: {r}");
            }
        }
    }
    assert_eq!(set["packages"].as_array().unwrap().len(), n, "{set}");
}

#[test]
fn packages_import_in_programmatic_runs_too() {
    let s = node_server(1);
    require_set(&s);
    let tools = json!([{"name": "total", "description": "sums", "parameters": {"type": "object", "properties": {"xs": {"type": "array"}}, "required": ["xs"]}}]);
    for lang in ["js", "ts"] {
        let code = "import _ from 'lodash';\nimport dayjs from 'dayjs';\nconst t = await total({ xs: _.range(1, 5) });\nconsole.log(t, dayjs('2024-02-29').add(1, 'year').format('YYYY-MM-DD'));\n";
        let (status, r) = s.post(
            "/v1/exec/programmatic",
            &json!({"lang": lang, "code": code, "tools": tools}),
        );
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["status"], "tool_call_required", "{lang}: {r}");
        let call = &r["tool_calls"][0];
        assert_eq!(call["arguments"]["xs"], json!([1, 2, 3, 4]), "{r}");
        let (status, last) = s.post(
            "/v1/exec/programmatic",
            &json!({"session_id": r["session_id"], "continuation_token": r["continuation_token"],
                    "tool_results": [{"call_id": call["id"], "result": 10, "is_error": false}]}),
        );
        assert_eq!(status, 200, "{last}");
        assert_eq!(last["status"], "completed", "{lang}: {last}");
        assert_eq!(last["stdout"], "10 2025-02-28\n", "{lang}: {last}");
    }
}

#[test]
fn packages_compute_known_answers() {
    let s = node_server(0);
    require_set(&s);
    let c = Client::anonymous(&s);
    let code = r#"import _ from 'lodash';
import dayjs from 'dayjs';
import Papa from 'papaparse';
import { z } from 'zod';
import * as math from 'mathjs';
import ExcelJS from 'exceljs';
import sharp from 'sharp';
import { format } from 'date-fns';
import * as yaml from 'js-yaml';
import { marked } from 'marked';
import * as cheerio from 'cheerio';
import { PDFDocument } from 'pdf-lib';
import fs from 'node:fs';

console.log(JSON.stringify(_.chunk([1, 2, 3, 4, 5], 2)), _.sumBy([{ n: 2 }, { n: 5 }], 'n'));
console.log(dayjs('2024-01-31').add(1, 'month').format('YYYY-MM-DD'), format(new Date(2020, 0, 2), 'yyyy/MM/dd'));
const parsed = Papa.parse('a,b\n1,x\n2,y', { header: true, dynamicTyping: true });
console.log(JSON.stringify(parsed.data));
const User = z.object({ name: z.string(), age: z.number().int() });
console.log(User.safeParse({ name: 'ada', age: 36 }).success, User.safeParse({ name: 'ada', age: 'x' }).success);
console.log(math.evaluate('sqrt(16) + det([[1, 2], [3, 4]])'), math.format(math.fraction(1, 3).add(math.fraction(1, 6))));
console.log(JSON.stringify(yaml.load('a: [1, 2]\nb: {c: true}')), marked.parse('# Hi').trim(), cheerio.load('<p class="x">yo</p>')('.x').text());

const wb = new ExcelJS.Workbook();
const ws = wb.addWorksheet('Sales');
ws.addRow(['city', 'sales']);
ws.addRow(['oslo', 3]);
ws.addRow(['lima', 4]);
ws.getCell('B4').value = { formula: 'SUM(B2:B3)', result: 7 };
await wb.xlsx.writeFile('sales.xlsx');
const back = new ExcelJS.Workbook();
await back.xlsx.readFile('sales.xlsx');
const sheet = back.getWorksheet('Sales');
console.log(sheet.rowCount, sheet.getCell('A3').value, sheet.getCell('B4').value.formula, sheet.getCell('B4').result);

const png = await sharp({ create: { width: 64, height: 48, channels: 3, background: '#336699' } }).png().toBuffer();
await sharp(png).resize(16, 12).png().toFile('small.png');
const meta = await sharp('small.png').metadata();
console.log(meta.format, meta.width, meta.height);

const pdf = await PDFDocument.create();
pdf.addPage([200, 100]);
fs.writeFileSync('out.pdf', await pdf.save());
console.log((await PDFDocument.load(fs.readFileSync('out.pdf'))).getPageCount());
"#;
    let want = "[[1,2],[3,4],[5]] 7\n\
2024-02-29 2020/01/02\n\
[{\"a\":1,\"b\":\"x\"},{\"a\":2,\"b\":\"y\"}]\n\
true false\n\
2 1/2\n\
{\"a\":[1,2],\"b\":{\"c\":true}} <h1>Hi</h1> yo\n\
4 lima SUM(B2:B3) 7\n\
png 16 12\n\
1\n";
    for lang in ["js", "ts"] {
        let r = c.exec(json!({"lang": lang, "code": code}));
        assert_eq!(r["status"], "ok", "{lang}: {r}");
        assert_eq!(r["stdout"], want, "{lang}: {r}");
        assert_eq!(r["stderr"], "", "{lang}: {r}");
        // The resized image comes back as a PNG of the asked size.
        let bytes = download_output(&c, &r, "small.png");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        let width = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
        let height = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
        assert_eq!((width, height), (16, 12));
        assert!(
            download_output(&c, &r, "sales.xlsx").starts_with(b"PK"),
            "not an xlsx (zip)"
        );
    }
}

#[test]
fn the_packages_are_read_only_in_the_sandbox() {
    let s = node_server(0);
    require_set(&s);
    let code = r#"import fs from 'node:fs';
const tries = [
  () => fs.writeFileSync('/node_modules/lodash/lodash.js', 'module.exports = 1'),
  () => fs.writeFileSync('/node_modules/new.js', 'x'),
  () => fs.rmSync('/node_modules/dayjs', { recursive: true }),
  () => fs.mkdirSync('/node_modules/evil'),
  () => fs.symlinkSync('/tmp', '/node_modules/evil'),
];
for (const t of tries) {
  try { t(); console.log('WROTE'); } catch (e) { console.log(e.code); }
}
const _ = (await import('lodash')).default;
console.log(typeof _.chunk);
"#;
    let r = s.exec(json!({"lang": "js", "code": code}));
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["stdout"], "EROFS\nEROFS\nEROFS\nEROFS\nEROFS\nfunction\n", "{r}");
    // And Python, which does not use it, sees it read-only as well.
    let r = s.py("import os\ntry:\n    open('/node_modules/x', 'w')\nexcept OSError as e:\n    print(e.errno == 30)\n");
    assert_eq!(r["stdout"], "True\n", "{r}");
}

#[test]
fn runtimes_and_doctor_list_the_npm_packages() {
    let s = node_server(0);
    let set = require_set(&s);
    let listed: Vec<(String, String)> = set["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["version"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut want = pinned();
    want.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, want);
    let name = set["name"].as_str().unwrap();
    assert!(name.starts_with("npm-") && name.len() == "npm-".len() + 16, "{set}");
    // No host path in the answer.
    assert!(!set.to_string().contains(&runtime_dir().display().to_string()), "{set}");

    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .arg("doctor")
        .env("SANDCALL_RUNTIME_DIR", runtime_dir())
        .env("SANDCALL_DATA_DIR", Server::new_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("npm packages"))
        .unwrap_or_else(|| panic!("doctor has no npm line: {text}"));
    assert!(line.contains(name), "{line}");
    for (p, v) in pinned() {
        assert!(line.contains(&format!("{p} {v}")), "{p} {v} missing: {line}");
    }
}

#[test]
fn without_the_set_js_runs_with_node_modules_only() {
    // A runtime directory without the set: JavaScript still runs, `import 'lodash'`
    // fails as it would anywhere, and /v1/runtimes lists no npm set.
    let empty = Server::new_visible_dir();
    let s = Server::start_with(&[("SANDCALL_RUNTIME_DIR", empty.to_str().unwrap())], "");
    let r = s.exec(json!({"lang": "js", "code": "console.log(1);\nawait import('lodash');"}));
    assert_eq!(r["stdout"], "1\n", "{r}");
    assert_eq!(r["status"], "failed", "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("ERR_MODULE_NOT_FOUND"), "{r}");
    let v = Client::anonymous(&s).get("/v1/runtimes").json();
    assert!(
        !v["runtimes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["language"] == "javascript"),
        "{v}"
    );
}

#[test]
fn runtime_install_without_npm_warns_and_succeeds() {
    crate::common::require_root();
    // A runtime directory that already holds the Python runtime (linked), and no npm
    // anywhere: the npm set is skipped with a warning that says how to get it.
    let dir = Server::new_dir();
    let rts = dir.join("runtimes");
    std::fs::create_dir_all(&rts).unwrap();
    let python = std::fs::read_dir(runtime_dir())
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("python-"))
        .expect("no Python runtime installed: run `sandcall runtime install` (.ci/run does)");
    std::os::unix::fs::symlink(python.path(), rts.join(python.file_name())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["runtime", "install"])
        .env("SANDCALL_RUNTIME_DIR", &rts)
        .env("SANDCALL_NODE", dir.join("no-node/node"))
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: npm is not installed"), "{stderr}");
    assert!(stderr.contains("run without npm packages"), "{stderr}");
    let left: Vec<String> = std::fs::read_dir(&rts)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("npm-") || n.contains(".partial-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
