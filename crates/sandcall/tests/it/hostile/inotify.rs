//! inotify would let a run watch the read-only runtime it shares with every other run
//! (`/usr/lib/python3*/__pycache__`) and see when another tenant imports a module.

use crate::common::{hostile, Server};
use serde_json::{json, Value};

#[test]
fn inotify_is_refused() {
    let s = Server::start();
    let r = s.exec(json!({"code": hostile("inotify.py")}));
    assert_eq!(r["status"], "ok", "{r}");
    let v: Value = serde_json::from_str(r["stdout"].as_str().unwrap().trim()).unwrap_or_else(|e| panic!("{e}: {r}"));
    // EPERM, as for fanotify and the rest of the deny list.
    assert_eq!(
        v,
        json!({"inotify_init1": 1, "inotify_init": 1, "inotify_add_watch": 1}),
        "{r}"
    );
}
