//! The served OpenAPI document: the same as docs/openapi.json, and true to the server's
//! answers on the routes it describes (the schemathesis run in CI checks every route).

use crate::common::Server;
use serde_json::Value;

fn checked_in() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_served_document_is_the_checked_in_one() {
    let s = Server::start();
    let (status, _, served) = s.request("GET", "/openapi.json", None, None);
    assert_eq!(status, 200, "{served}");
    assert_eq!(served, checked_in());
    assert_eq!(served["openapi"], "3.1.0");
}

/// The documented shapes match real answers: a health report, a run, and an error.
#[test]
fn real_answers_have_the_documented_fields() {
    let doc = checked_in();
    let schemas = &doc["components"]["schemas"];
    let required = |name: &str| -> Vec<String> {
        schemas[name]["required"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no required list"))
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let s = Server::start();
    let (_, _, health) = s.request("GET", "/v1/health", None, None);
    let run = s.py("print(1)");
    let (status, error) = s.post("/v1/exec", &serde_json::json!({"code": ""}));
    assert_eq!(status, 400);
    for (name, answer) in [("Health", &health), ("ExecResponse", &run), ("ErrorBody", &error)] {
        let fields = required(name);
        assert!(!fields.is_empty(), "{name}");
        for field in fields {
            assert!(
                answer.get(&field).is_some(),
                "{name}.{field} is documented but missing: {answer}"
            );
        }
        for key in answer.as_object().unwrap().keys() {
            assert!(
                schemas[name]["properties"].get(key).is_some(),
                "{name}.{key} is answered but not documented"
            );
        }
    }
}
