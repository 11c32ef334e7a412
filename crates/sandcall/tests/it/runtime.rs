//! The managed Python runtime over HTTP: the data stack imports and computes, figures
//! come back as PNG files, nothing prints font messages, the runtime is read-only in
//! the sandbox, warm and cold runs agree, and `GET /v1/runtimes` and `doctor` list it.
//!
//! These tests need the runtime that `.ci/run` installs (`sandcall runtime install`
//! into SANDCALL_RUNTIME_DIR, default `target/runtimes`): without it they fail, loudly.

use crate::common::{runtime_dir, Server};
use crate::files::{file_part, Client};
use serde_json::{json, Value};
use std::process::Command;

/// The runtime's packages as GET /v1/runtimes says; fails when the server has none.
/// The data stack, for the servers whose warm sandboxes preload it (the default list; the
/// test servers keep no preloaded sandboxes unless a test asks, as these do).
const PRELOAD: &str = r#"["numpy","pandas","matplotlib.pyplot"]"#;

/// A server with one plain warm sandbox per language and one preloaded Python one.
const PRELOADED: [(&str, &str); 3] = [
    ("SANDCALL_WARM_POOL_SIZE", "1"),
    ("SANDCALL_WARM_PRELOAD", PRELOAD),
    ("SANDCALL_WARM_PRELOAD_POOL_SIZE", "1"),
];

fn require_runtime(s: &Server) -> Vec<Value> {
    let reply = Client::anonymous(s).get("/v1/runtimes");
    assert_eq!(reply.status, 200, "{reply}");
    let v = reply.json();
    // The Python runtime; the npm set for programs (language javascript) may be listed too.
    let runtimes: Vec<Value> = v["runtimes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["language"] == "python")
        .collect();
    assert!(
        runtimes.len() == 1,
        "no Python runtime in {}: install it with `sandcall runtime install` and \
         SANDCALL_RUNTIME_DIR set to that directory (.ci/run does): {v}",
        runtime_dir().display()
    );
    runtimes[0]["packages"].as_array().cloned().unwrap_or_default()
}

/// The version of `name` the lock pins.
fn pinned(name: &str) -> String {
    let lock = include_str!("../../../../runtimes/python/requirements.lock");
    lock.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}==")))
        .unwrap_or_else(|| panic!("{name} is not in the lock"))
        .to_owned()
}

fn output<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["files"]
        .as_array()
        .and_then(|files| files.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no output {name}: {r}"))
}

/// The PNG's width from its IHDR chunk, after checking its magic bytes.
fn png_width(bytes: &[u8]) -> u32 {
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &bytes[..bytes.len().min(16)]
    );
    u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]])
}

fn assert_quiet(r: &Value) {
    let stderr = r["stderr"].as_str().unwrap_or_default();
    for noise in ["Fontconfig", "font cache", "fontlist", "Matplotlib", "non-interactive"] {
        assert!(!stderr.contains(noise), "{noise} on stderr: {r}");
    }
}

#[test]
fn a_csv_is_grouped_with_pandas_and_charted_with_plt_show() {
    let s = Server::start();
    require_runtime(&s);
    let c = Client::anonymous(&s);
    let mut csv = String::from("city,sales\n");
    for i in 0..1000 {
        csv.push_str(&format!("{},{}\n", ["oslo", "lima", "pune"][i % 3], i % 10));
    }
    let up = c.upload("sales.csv", "text/csv", csv.as_bytes());
    let code = "import pandas as pd\nimport matplotlib.pyplot as plt\n\
df = pd.read_csv('sales.csv')\n\
totals = df.groupby('city')['sales'].sum()\n\
print(totals.to_dict())\n\
totals.plot.bar()\n\
plt.show()\n";
    let r = c.exec(json!({"lang": "py", "code": code, "files": [up.input("sales.csv")]}));
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "{'lima': 1497, 'oslo': 1503, 'pune': 1500}\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    assert_quiet(&r);
    let chart = output(&r, "plot_0.png");
    let reply = c.download(
        chart["storage_session_id"].as_str().unwrap(),
        chart["id"].as_str().unwrap(),
    );
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(png_width(&reply.body), 640, "matplotlib's default 6.4 in at 100 dpi");
}

#[test]
fn figures_left_open_are_saved_and_dpi_is_capped_at_200() {
    let s = Server::start();
    require_runtime(&s);
    let c = Client::anonymous(&s);
    let code = "import matplotlib.pyplot as plt\n\
plt.figure(dpi=600); plt.plot([1, 3, 2])\n\
plt.show()\n\
f = plt.figure(); plt.plot([2, 1])\n\
g = plt.figure(); g.savefig('mine.png', dpi=1000)\n\
print('done')\n";
    let r = c.exec(json!({"lang": "py", "code": code}));
    assert_eq!(r["stdout"], "done\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    let session = r["session_id"].as_str().unwrap();
    let width = |name: &str| {
        let reply = c.download(session, output(&r, name)["id"].as_str().unwrap());
        png_width(&reply.body)
    };
    // Shown at 600 dpi: saved at 200 (6.4 in × 200).
    assert_eq!(width("plot_0.png"), 1280);
    // Never shown nor saved: saved at exit, at the figure's 100 dpi.
    assert_eq!(width("plot_1.png"), 640);
    // Saved by the program at 1000 dpi: capped. And not saved again at exit.
    assert_eq!(width("mine.png"), 1280);
    assert_eq!(r["files"].as_array().unwrap().len(), 3, "{r}");
}

#[test]
fn excel_sklearn_and_scipy_compute_known_answers() {
    let s = Server::start();
    require_runtime(&s);
    let code = "import openpyxl\n\
wb = openpyxl.Workbook(); ws = wb.active\n\
ws.append(['x', 'y'])\n\
for x in range(5): ws.append([x, 2 * x + 1])\n\
wb.save('t.xlsx')\n\
import pandas as pd\n\
df = pd.read_excel('t.xlsx')\n\
print(df['y'].sum())\n\
from sklearn.linear_model import LinearRegression\n\
m = LinearRegression().fit(df[['x']], df['y'])\n\
print(round(float(m.coef_[0]), 6), round(float(m.intercept_), 6))\n\
from scipy import optimize, stats\n\
print(round(optimize.brentq(lambda v: v * v - 2, 0, 2), 6))\n\
print(round(float(stats.norm.cdf(0)), 6))\n";
    let r = s.py(code);
    assert_eq!(r["stdout"], "25\n2.0 1.0\n1.414214\n0.5\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
}

#[test]
fn the_runtime_is_read_only_inside_the_sandbox() {
    let s = Server::start();
    require_runtime(&s);
    let code = "import os, numpy
d = os.path.dirname(numpy.__file__)
for p in [os.path.join(d, 'x'), numpy.__file__]:
    try:
        open(p, 'a').write('x'); print('wrote', p)
    except OSError as e:
        print(type(e).__name__, e.errno)
print(bool(os.statvfs(d).f_flag & os.ST_RDONLY), bool(os.statvfs('/etc/fonts').f_flag & os.ST_RDONLY))
";
    let r = s.py(code);
    // A new file: EROFS (the mount is read-only); an existing one: not the sandbox
    // user's either.
    assert_eq!(r["stdout"], "OSError 30\nPermissionError 13\nTrue True\n", "{r}");
}

#[test]
fn get_runtimes_lists_every_package_and_needs_credentials() {
    let s = Server::start();
    let packages = require_runtime(&s);
    for name in ["numpy", "pandas", "matplotlib", "scikit-learn"] {
        let entry = packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {packages:?}"));
        assert_eq!(entry["version"], pinned(name));
    }
    // Behind authentication like every route but health.
    let s = Server::start_with(&[("SANDCALL_API_KEYS", "ops:k-0123456789abcdef0123456789")], "");
    let reply = Client::anonymous(&s).get("/v1/runtimes");
    assert_eq!(reply.status, 401, "{reply}");
    let reply = Client::api_key(&s, "k-0123456789abcdef0123456789").get("/v1/runtimes");
    assert_eq!(reply.status, 200, "{reply}");
}

#[test]
fn doctor_lists_the_runtime_and_its_versions() {
    crate::common::require_root();
    let dir = std::env::temp_dir().join(format!("sandcall-rt-doctor-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["doctor", "--data-dir"])
        .arg(&dir)
        .env("SANDCALL_RUNTIME_DIR", runtime_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("[pass] python runtime"), "{text}");
    assert!(text.contains(&format!("numpy {}", pinned("numpy"))), "{text}");
    assert!(text.contains(&format!("pandas {}", pinned("pandas"))), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn warm_and_cold_runs_agree_and_random_sources_differ() {
    let warm = Server::start_with(&PRELOADED, "");
    require_runtime(&warm);
    let cold = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "0")], "");
    let code = "import numpy as np, pandas as pd, random\n\
df = pd.DataFrame({'k': list('abab'), 'v': [1, 2, 3, 4]})\n\
print(df.groupby('k')['v'].sum().to_dict(), np.arange(4).sum())\n\
print(np.random.random(), random.random())\n";
    let mut seen = std::collections::HashSet::new();
    let mut results = Vec::new();
    for _ in 0..2 {
        warm.wait_warm(3);
        let (kind, r) = warm.exec_kind(&json!({"code": code}).to_string());
        assert_eq!(kind, "warm", "{r}");
        results.push(r);
        let (kind, r) = cold.exec_kind(&json!({"code": code}).to_string());
        assert_eq!(kind, "cold", "{r}");
        results.push(r);
    }
    for r in &results {
        let stdout = r["stdout"].as_str().unwrap_or_default();
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("{'a': 4, 'b': 6} 6"), "{r}");
        assert_eq!(r["stderr"], "", "{r}");
        assert!(
            seen.insert(lines.next().unwrap_or_default().to_owned()),
            "a random draw repeated: {r}"
        );
    }
}

#[test]
fn an_uploaded_csv_charted_in_a_warm_sandbox_comes_back_as_png() {
    let s = Server::start_with(&PRELOADED, "");
    require_runtime(&s);
    let c = Client::anonymous(&s);
    let up = c.upload_parts(&[file_part("d.csv", "text/csv", b"a,b\n1,2\n3,4\n")]);
    assert_eq!(up.status, 200, "{up}");
    let up = up.json();
    let file = json!({"id": up["files"][0]["id"], "storage_session_id": up["storage_session_id"], "name": "d.csv"});
    s.wait_warm(3);
    let body = json!({"code": "import pandas as pd, matplotlib.pyplot as plt\npd.read_csv('d.csv').plot()\nplt.show()", "files": [file]});
    let (kind, r) = s.exec_kind(&body.to_string());
    assert_eq!(kind, "warm", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    let chart = output(&r, "plot_0.png");
    let reply = c.download(
        chart["storage_session_id"].as_str().unwrap(),
        chart["id"].as_str().unwrap(),
    );
    png_width(&reply.body);
}

/// `sandcall serve` with this environment, its stderr collected; returns the server
/// (once it listens) and what it printed before.
fn serve_capturing(dir: &std::path::Path, env: &[(&str, &str)]) -> (std::process::Child, String, String) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcall"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .env_remove("SANDCALL_API_KEYS")
        .env("SANDCALL_LOG", "warn")
        .env("SANDCALL_WARM_POOL_SIZE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("sandcall listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let (etx, erx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = etx.send(text.clone());
        }
    });
    let url = rx.recv_timeout(std::time::Duration::from_secs(240));
    let mut text = String::new();
    while let Ok(t) = erx.recv_timeout(std::time::Duration::from_millis(200)) {
        text = t;
    }
    match url {
        Ok(url) => (child, url, text),
        Err(_) => {
            let _ = child.kill();
            panic!("serve did not start: {text}");
        }
    }
}

#[test]
fn first_start_without_the_registry_warns_and_serves_on_the_bare_interpreter() {
    crate::common::require_root();
    let dir = Server::new_dir();
    let runtimes = Server::new_visible_dir();
    // pip pointed at a closed port, without retries: the registry is unreachable.
    let (mut child, url, stderr) = serve_capturing(
        &dir,
        &[
            ("SANDCALL_RUNTIME_DIR", runtimes.to_str().unwrap()),
            ("SANDCALL_INSTALL_RUNTIME", "true"),
            ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
            ("PIP_RETRIES", "0"),
            ("PIP_TIMEOUT", "2"),
            ("PIP_NO_CACHE_DIR", "1"),
            // npm too, with an empty cache of its own: the npm set cannot be installed.
            ("npm_config_registry", "http://127.0.0.1:9/"),
            ("npm_config_fetch_retries", "0"),
            ("npm_config_fetch_timeout", "2000"),
            ("npm_config_cache", dir.join("npm-cache").to_str().unwrap()),
        ],
    );
    // Where it goes, how to skip it, and what happened.
    assert!(stderr.contains("installing the Python runtime"), "{stderr}");
    assert!(stderr.contains(&runtimes.display().to_string()), "{stderr}");
    assert!(stderr.contains("SANDCALL_INSTALL_RUNTIME=false"), "{stderr}");
    assert!(stderr.contains("could not install the Python runtime"), "{stderr}");
    assert!(stderr.contains("could not install the npm packages"), "{stderr}");
    let c = Client::at(&url);
    let r = c.exec(json!({"lang": "py", "code": "import sys\nprint(sys.executable)\nimport numpy"}));
    assert_eq!(r["stdout"], "/usr/bin/python3\n", "the bare interpreter: {r}");
    assert!(
        r["stderr"].as_str().unwrap_or_default().contains("ModuleNotFoundError"),
        "{r}"
    );
    assert_eq!(c.get("/v1/runtimes").json(), json!({"runtimes": []}));
    // Nothing half-installed is left.
    let left: Vec<String> = std::fs::read_dir(&runtimes)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("python-") || n.starts_with("npm-") || n.contains(".partial-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&runtimes);
}

#[test]
fn first_start_finds_an_installed_runtime_and_install_is_idempotent() {
    crate::common::require_root();
    let dir = Server::new_dir();
    let rt = runtime_dir();
    let rt = rt.to_str().unwrap();
    // `runtime install` on an installed runtime: quick, says so, prints its directory.
    let out = Command::new(env!("CARGO_BIN_EXE_sandcall"))
        .args(["runtime", "install"])
        .env("SANDCALL_RUNTIME_DIR", rt)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("already installed"), "{stderr}");
    // One line per runtime: the Python runtime's directory, then the npm set's.
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("/python-") && lines[1].contains("/npm-"), "{stdout}");
    let installed = lines[0].to_owned();
    // serve with install_runtime on (the default) uses it, without installing.
    let (mut child, url, stderr) = serve_capturing(&dir, &[("SANDCALL_RUNTIME_DIR", rt)]);
    assert!(!stderr.contains("installing"), "{stderr}");
    let r = Client::at(&url).exec(json!({"lang": "py", "code": "import sys, numpy\nprint(sys.prefix)"}));
    assert_eq!(r["stdout"], format!("{installed}/venv\n"), "{r}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn warm_sandboxes_have_the_data_stack_imported_already() {
    let s = Server::start_with(&PRELOADED, "");
    require_runtime(&s);
    let code = "import os, sys, time\n\
before = [m in sys.modules for m in ('numpy', 'pandas', 'matplotlib.pyplot')]\n\
t = time.perf_counter()\n\
import numpy, pandas, matplotlib.pyplot\n\
took = time.perf_counter() - t\n\
print(before, took < 0.05, 'SANDCALL_PRELOAD' in os.environ)\n";
    s.wait_warm(3);
    let (kind, r) = s.exec_kind(&json!({"code": code}).to_string());
    assert_eq!(kind, "warm", "{r}");
    assert_eq!(r["stdout"], "[True, True, True] True False\n", "{r}");
    // Code that imports none of them takes a plain warm sandbox, which has not.
    s.wait_warm(3);
    let (kind, r) = s.exec_kind(&json!({"code": "import sys\nprint('pandas' in sys.modules)"}).to_string());
    assert_eq!(kind, "warm", "{r}");
    assert_eq!(r["stdout"], "False\n", "{r}");
    // A cold run imports them itself; without preloaded sandboxes, a warm run does too.
    let (kind, r) =
        Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "0")], "").exec_kind(&json!({"code": code}).to_string());
    assert_eq!(kind, "cold", "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .starts_with("[False, False, False]"),
        "{r}"
    );
    let off = Server::start_with(&[("SANDCALL_WARM_POOL_SIZE", "1")], "");
    off.wait_warm(2);
    let (kind, r) = off.exec_kind(&json!({"code": code}).to_string());
    assert_eq!(kind, "warm", "{r}");
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .starts_with("[False, False, False]"),
        "{r}"
    );
}

#[test]
fn a_refilled_warm_sandbox_is_handed_out_only_once_its_imports_are_done() {
    // One warm Python sandbox: each run takes it, and the next run must find the refill
    // fully imported (its run does not pay for the preload, so a 400 ms timeout holds).
    let s = Server::start_with(&PRELOADED, "");
    require_runtime(&s);
    let code = "import sys\nprint('pandas' in sys.modules, flush=True)\nimport pandas";
    for _ in 0..3 {
        s.wait_warm(3);
        let (kind, r) = s.exec_kind(&json!({"code": code, "timeout": 400}).to_string());
        assert_eq!(kind, "warm", "{r}");
        assert_eq!(r["stdout"], "True\n", "{r}");
        assert!(
            r["cpu_time"].as_u64().unwrap_or(u64::MAX) < 300,
            "the preload was billed to the run: {r}"
        );
    }
}

#[test]
fn a_preloaded_sandbox_has_drawn_a_throwaway_figure_and_left_nothing() {
    // The preload draws one chart in memory (fonts, the Agg canvas and pandas' plotting
    // backend loaded), so a run's first figure is cheaper; the run sees no trace of it.
    let s = Server::start_with(&PRELOADED, "");
    require_runtime(&s);
    let code = "import os, sys\nimport matplotlib.pyplot as plt\n\
print('pandas.plotting._matplotlib' in sys.modules, plt.get_fignums(), sorted(os.listdir('.')))\n\
fig = plt.figure()\n\
print(fig.number, plt.gca().get_title() == '')\n\
plt.show()\n";
    s.wait_warm(3);
    let (kind, r) = s.exec_kind(&json!({"code": code}).to_string());
    assert_eq!(kind, "warm", "{r}");
    assert_eq!(r["stdout"], "True [] []\n1 True\n", "{r}");
    // The run's own figure is saved as plot_0.png, the first name.
    output(&r, "plot_0.png");
    assert_quiet(&r);
}
