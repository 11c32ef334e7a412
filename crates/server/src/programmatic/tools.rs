//! The declared tools of a programmatic run, and the check every call passes before it
//! can reach the caller: the tool exists, its arguments fit the size cap and the tool's
//! JSON Schema. Pure logic, no I/O.

use crate::runtime::ToolNames;
use serde_json::{Map, Value};
use std::collections::HashSet;

/// The most tools one run may declare.
pub const MAX_TOOLS: usize = 100;

pub struct Tool {
    pub names: ToolNames,
    pub parameters: Value,
    validator: jsonschema::Validator,
}

pub struct ToolSet {
    pub tools: Vec<Tool>,
}

/// Why a declaration was refused (answered as 400 `invalid_tool_schema`).
#[derive(Debug, PartialEq)]
pub struct DeclarationError(pub String);

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' '))
        && name.chars().any(|c| c.is_ascii_alphanumeric())
}

impl ToolSet {
    pub fn declare(decls: &[sandcall_api::ToolDecl]) -> Result<ToolSet, DeclarationError> {
        let err = |m: String| Err(DeclarationError(m));
        if decls.len() > MAX_TOOLS {
            return err(format!(
                "at most {MAX_TOOLS} tools may be declared, got {}",
                decls.len()
            ));
        }
        let mut tools: Vec<Tool> = Vec::with_capacity(decls.len());
        for decl in decls {
            if !valid_name(&decl.name) {
                return err(format!(
                    "tool name {:?} must be 1 to 64 characters of letters, digits, `_`, `-`, `.` and spaces",
                    decl.name
                ));
            }
            let names = ToolNames::new(&decl.name);
            if let Some(other) = tools.iter().find(|t| {
                t.names.declared == names.declared || t.names.python == names.python || t.names.bash == names.bash
            }) {
                return err(format!(
                    "tools {:?} and {:?} have the same name in the program",
                    other.names.declared, names.declared
                ));
            }
            let parameters = decl
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object"}));
            if !parameters.is_object() {
                return err(format!("parameters of {:?} must be a JSON Schema object", decl.name));
            }
            check_refs(&parameters).map_err(|m| DeclarationError(format!("parameters of {:?}: {m}", decl.name)))?;
            let validator = jsonschema::validator_for(&parameters).map_err(|e| {
                DeclarationError(format!(
                    "parameters of {:?} are not a valid JSON Schema: {e}",
                    decl.name
                ))
            })?;
            tools.push(Tool {
                names,
                parameters,
                validator,
            });
        }
        Ok(ToolSet { tools })
    }

    pub fn names(&self) -> Vec<ToolNames> {
        self.tools.iter().map(|t| t.names.clone()).collect()
    }

    /// Checks one call; returns the arguments object to forward, or why it is refused.
    pub fn check(
        &self,
        name: &str,
        arguments: Option<Value>,
        argv: Option<Vec<String>>,
        max_bytes: u64,
    ) -> Result<Value, String> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.names.declared == name)
            .ok_or_else(|| format!("unknown tool {name:?}: it was not declared for this run"))?;
        let arguments = match (arguments, argv) {
            (Some(Value::Null) | None, None) => Value::Object(Map::new()),
            (Some(v @ Value::Object(_)), None) => v,
            (Some(other), None) => return Err(format!("arguments of {name} must be an object, got {other}")),
            (None, Some(argv)) => arguments_from_argv(&argv, &tool.parameters)?,
            (Some(_), Some(_)) => return Err("a call carries either arguments or argv".into()),
        };
        let size = serde_json::to_vec(&arguments).map(|v| v.len()).unwrap_or(usize::MAX) as u64;
        if size > max_bytes {
            return Err(format!(
                "the arguments of {name} are {size} bytes, over the limit of {max_bytes} (max_tool_call_bytes)"
            ));
        }
        if let Some(error) = tool.validator.iter_errors(&arguments).next() {
            let at = error.instance_path.to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at {at}")
            };
            return Err(format!("the arguments of {name} do not match its schema{at}: {error}"));
        }
        Ok(arguments)
    }
}

/// Bash's forms: one JSON object, or `key=value` words whose values take the type the
/// schema gives the property (integer, number, boolean, array/object as JSON; else text).
pub fn arguments_from_argv(argv: &[String], schema: &Value) -> Result<Value, String> {
    if let [only] = argv {
        if only.trim_start().starts_with('{') {
            return match serde_json::from_str::<Value>(only) {
                Ok(v @ Value::Object(_)) => Ok(v),
                _ => Err(format!("{only:?} is not a JSON object")),
            };
        }
    }
    let mut map = Map::new();
    for word in argv {
        let (key, raw) = word
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("argument {word:?} is not key=value (or pass one JSON object)"))?;
        let kind = schema.pointer(&format!(
            "/properties/{}/type",
            key.replace('~', "~0").replace('/', "~1")
        ));
        let value = match kind.and_then(Value::as_str) {
            Some("integer") => raw
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("{key}: expected an integer, got {raw:?}"))?,
            Some("number") => raw
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| format!("{key}: expected a number, got {raw:?}"))?,
            Some("boolean") => match raw {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(format!("{key}: expected true or false, got {raw:?}")),
            },
            Some("array" | "object") => {
                serde_json::from_str(raw).map_err(|_| format!("{key}: expected JSON, got {raw:?}"))?
            }
            _ => Value::String(raw.to_owned()),
        };
        if map.insert(key.to_owned(), value).is_some() {
            return Err(format!("argument {key} is given twice"));
        }
    }
    Ok(Value::Object(map))
}

/// Refuses schemas whose local `$ref`s form a cycle (they cannot be called with a
/// finite description), and any `$ref` that is not local.
pub fn check_refs(root: &Value) -> Result<(), String> {
    fn walk(node: &Value, root: &Value, stack: &mut Vec<String>, done: &mut HashSet<String>) -> Result<(), String> {
        match node {
            Value::Object(map) => {
                if let Some(r) = map.get("$ref") {
                    let r = r.as_str().ok_or("$ref must be a string")?;
                    let pointer = r
                        .strip_prefix('#')
                        .ok_or_else(|| format!("only local $ref (\"#/...\") is supported, got {r:?}"))?;
                    if stack.iter().any(|s| s == r) {
                        return Err(format!("Circular $ref detected: {} -> {r}", stack.join(" -> ")));
                    }
                    if !done.contains(r) {
                        let target = root
                            .pointer(pointer)
                            .ok_or_else(|| format!("$ref {r:?} points at nothing"))?;
                        stack.push(r.to_owned());
                        walk(target, root, stack, done)?;
                        stack.pop();
                        done.insert(r.to_owned());
                    }
                }
                for (k, v) in map {
                    if k != "$ref" {
                        walk(v, root, stack, done)?;
                    }
                }
                Ok(())
            }
            Value::Array(items) => items.iter().try_for_each(|v| walk(v, root, stack, done)),
            _ => Ok(()),
        }
    }
    walk(root, root, &mut Vec::new(), &mut HashSet::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decl(name: &str, parameters: Value) -> sandcall_api::ToolDecl {
        sandcall_api::ToolDecl {
            name: name.into(),
            description: None,
            parameters: Some(parameters),
        }
    }

    #[test]
    fn circular_refs_are_refused_and_dags_are_not() {
        let circular = json!({"$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"});
        assert!(check_refs(&circular).unwrap_err().contains("Circular $ref detected"));
        let mutual = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"items": {"$ref": "#/$defs/a"}}}});
        assert!(check_refs(&mutual).unwrap_err().contains("Circular $ref detected"));
        let shared = json!({"$defs": {"s": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/s"}, "y": {"$ref": "#/$defs/s"}}});
        assert!(check_refs(&shared).is_ok());
        assert!(check_refs(&json!({"$ref": "http://example.invalid/s.json"})).is_err());
        let err = ToolSet::declare(&[decl("t", circular)]).err().unwrap();
        assert!(err.0.contains("Circular $ref detected"), "{}", err.0);
    }

    #[test]
    fn calls_are_checked_against_the_schema_and_the_size_cap() {
        let tools = ToolSet::declare(&[decl(
            "get_rate",
            json!({"type": "object", "properties": {"base": {"type": "string"}}, "required": ["base"]}),
        )])
        .unwrap();
        assert_eq!(
            tools
                .check("get_rate", Some(json!({"base": "USD"})), None, 1000)
                .unwrap(),
            json!({"base": "USD"})
        );
        assert!(tools
            .check("get_rate", Some(json!({"base": 5})), None, 1000)
            .unwrap_err()
            .contains("do not match"));
        assert!(tools
            .check("get_rate", Some(json!({})), None, 1000)
            .unwrap_err()
            .contains("base"));
        assert!(tools
            .check("nope", Some(json!({})), None, 1000)
            .unwrap_err()
            .contains("not declared"));
        let big = json!({"base": "x".repeat(2000)});
        assert!(tools
            .check("get_rate", Some(big), None, 1000)
            .unwrap_err()
            .contains("max_tool_call_bytes"));
    }

    #[test]
    fn bash_words_take_the_schema_types() {
        let schema = json!({"properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}, "tags": {"type": "array"}}});
        let argv: Vec<String> = ["n=5", "x=2.5", "ok=true", "s=hello=world", "tags=[1,2]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            arguments_from_argv(&argv, &schema).unwrap(),
            json!({"n": 5, "x": 2.5, "ok": true, "s": "hello=world", "tags": [1, 2]})
        );
        assert!(arguments_from_argv(&["n=five".into()], &schema).is_err());
        assert!(arguments_from_argv(&["novalue".into()], &schema).is_err());
        assert_eq!(
            arguments_from_argv(&[r#"{"n": 1}"#.into()], &schema).unwrap(),
            json!({"n": 1})
        );
        assert_eq!(arguments_from_argv(&[], &schema).unwrap(), json!({}));
    }

    #[test]
    fn names_must_be_distinct_in_the_program() {
        assert!(ToolSet::declare(&[decl("a-b", json!({})), decl("a_b", json!({}))]).is_err());
        assert!(ToolSet::declare(&[decl("bad;name", json!({}))]).is_err());
        let many: Vec<_> = (0..101).map(|i| decl(&format!("t{i}"), json!({}))).collect();
        assert!(ToolSet::declare(&many).is_err());
    }
}
