//! The declared tools of a programmatic run, and the check every call passes before it
//! can reach the caller: the tool exists, its arguments fit the size caps and the tool's
//! JSON Schema. Pure logic, no I/O.
//!
//! A schema is data the caller controls, and validating a call costs work in proportion
//! to the schema's size *with every `$ref` replaced by its target*: local `$ref`s that
//! form a DAG (`d0: allOf[$ref d1, $ref d1]`, `d1: allOf[$ref d2, $ref d2]`, ...) have
//! no cycle, yet expand to 2^depth subschemas. So a declaration is refused unless its
//! expanded size, its depth and its byte size are under the bounds below; they are
//! generous for real tools, whose schemas are a few KiB and a few hundred subschemas.

use crate::runtime::ToolNames;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// The most tools one run may declare.
pub const MAX_TOOLS: usize = 100;

/// The most bytes one tool's `parameters` may take, as compact JSON: 64 KiB.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;

/// The most JSON values (objects, arrays, strings, numbers, ...) one tool's
/// `parameters` may hold once every `$ref` is replaced by its target: 10,000. This is
/// what bounds the work of compiling the schema and of validating one call against
/// it; a realistic 200-property tool is about 1,000.
pub const MAX_SCHEMA_EXPANDED: usize = 10_000;

/// The deepest nesting of objects and arrays one tool's `parameters` may reach,
/// through its `$ref`s: 64.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// How long the program waits for the check of one call (it runs on a blocking
/// thread, off the async workers): 1 s. A call whose check takes longer is refused.
pub const CHECK_TIME_BUDGET: Duration = Duration::from_secs(1);

/// A declared tool. Its schema is kept as compact JSON text and compiled afresh for each
/// check: a compiled validator takes tens of times the schema's size in memory (about
/// 1 MiB for a 20 KiB schema), and a session would hold it for as long as it lives,
/// while compiling takes about a millisecond (the bounds above keep it so).
pub struct Tool {
    pub names: ToolNames,
    schema: Box<str>,
    /// The MCP server sandcall calls this tool on, instead of the caller.
    mcp_server: Option<String>,
}

impl Tool {
    fn schema(&self) -> Result<(Value, jsonschema::Validator), CallError> {
        let failed = |e: String| {
            tracing::error!(tool = %self.names.declared, error = %e, "a declared schema did not compile again");
            CallError::SchemaBroken
        };
        let schema: Value = serde_json::from_str(&self.schema).map_err(|e| failed(e.to_string()))?;
        let validator = jsonschema::validator_for(&schema).map_err(|e| failed(e.to_string()))?;
        Ok((schema, validator))
    }
}

/// The declared tools. Cheap to clone, so a check can run on a blocking thread.
#[derive(Clone)]
pub struct ToolSet {
    tools: Arc<[Tool]>,
}

/// Why a declaration was refused (answered as 400 `invalid_tool_schema`).
#[derive(Debug, PartialEq)]
pub struct DeclarationError(pub String);

/// The byte limits a call's arguments must fit, besides its schema: each call, the
/// pause it would be handed out in, and the session's whole life.
#[derive(Clone, Copy, Debug)]
pub struct ByteBudget {
    /// `max_tool_call_bytes`.
    pub max_call: u64,
    /// `max_pause_bytes`, and what the calls pending for the next pause already take.
    pub max_pause: u64,
    pub pause_used: u64,
    /// `max_session_tool_bytes`, and what the session's accepted calls already took.
    pub max_session: u64,
    pub session_used: u64,
}

impl ByteBudget {
    /// Why arguments of `size` bytes do not fit, if they do not.
    fn refuse(&self, name: &str, size: u64) -> Option<CallError> {
        if size > self.max_call {
            return Some(CallError::OverCallLimit {
                name: name.to_owned(),
                size,
                limit: self.max_call,
            });
        }
        if self.pause_used.saturating_add(size) > self.max_pause {
            return Some(CallError::OverPauseLimit {
                name: name.to_owned(),
                size,
                limit: self.max_pause,
            });
        }
        if self.session_used.saturating_add(size) > self.max_session {
            return Some(CallError::OverSessionLimit {
                name: name.to_owned(),
                size,
                limit: self.max_session,
            });
        }
        None
    }
}

/// A call that passed the check: its arguments as the compact JSON text that is
/// forwarded, and that text's length, which the byte budgets count.
pub struct Checked {
    pub arguments: Box<RawValue>,
    pub size: u64,
}

/// The longest tool name, in characters; the helper refuses a call under a longer name.
pub const MAX_NAME_CHARS: usize = sandcall_sandbox::tools::MAX_NAME_CHARS;

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.chars().count()) && !name.chars().any(char::is_control)
}

/// The JSON Schema type names; any other `type` is read leniently (see `lenient_types`).
const JSON_TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "string", "integer"];

/// A `type` JSON Schema does not know, as the type it stands for: schemas written for
/// LibreChat say `float`, and Python-minded ones `int`, `str`, `bool`, `dict`, `list`.
/// Anything else unknown is read as `number`, as the Code Interpreter API does.
fn json_type(name: &str) -> &'static str {
    match name {
        "int" | "long" | "int32" | "int64" => "integer",
        "str" | "text" => "string",
        "bool" => "boolean",
        "dict" | "map" => "object",
        "list" | "tuple" => "array",
        "none" | "None" => "null",
        _ => "number",
    }
}

/// Keywords whose value is one subschema.
const SCHEMA_ONE: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
];
/// Keywords whose value is a list of subschemas.
const SCHEMA_LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value maps names to subschemas.
const SCHEMA_MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Rewrites every unknown `type` name in `schema` (and its subschemas) to the JSON
/// Schema type it stands for, in place. Only schema positions are visited: a property
/// that happens to be called `type` is left alone. Bounded by the declaration's bounds
/// (it runs after `check_schema`).
pub fn lenient_types(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    match map.get_mut("type") {
        Some(Value::String(t)) if !JSON_TYPES.contains(&t.as_str()) => *t = json_type(t).into(),
        Some(Value::Array(types)) => {
            for t in types.iter_mut() {
                if let Value::String(name) = t {
                    if !JSON_TYPES.contains(&name.as_str()) {
                        *name = json_type(name).into();
                    }
                }
            }
        }
        _ => {}
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if SCHEMA_MAP.contains(&key) {
            if let Value::Object(subs) = value {
                subs.values_mut().for_each(lenient_types);
            }
        } else if SCHEMA_LIST.contains(&key) && value.is_array() {
            if let Value::Array(subs) = value {
                subs.iter_mut().for_each(lenient_types);
            }
        } else if SCHEMA_ONE.contains(&key) {
            lenient_types(value);
        }
    }
}

/// The names of the top-level `properties` of a schema text, in the order written
/// (serde_json's maps sort their keys, so the order is read from the text itself).
pub fn property_order(text: &str) -> Vec<String> {
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(V)
        }
    }
    #[derive(serde::Deserialize)]
    struct Top {
        properties: Option<Keys>,
    }
    serde_json::from_str::<Top>(text)
        .ok()
        .and_then(|t| t.properties)
        .map_or_else(Vec::new, |k| k.0)
}

/// Python's positional order: required properties first, in the schema's order, then
/// the optional ones; and how many are required.
fn positional(order: Vec<String>, schema: &Value) -> (Vec<String>, usize) {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let (mut first, rest): (Vec<String>, Vec<String>) = order.into_iter().partition(|p| required.contains(&p.as_str()));
    let count = first.len();
    first.extend(rest);
    (first, count)
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
        for decl in decls {
            if !valid_name(&decl.name) {
                return err(format!(
                    "tool name {:?} must be 1 to {MAX_NAME_CHARS} characters, none of them a control character",
                    decl.name
                ));
            }
        }
        let declared: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
        let all_names = ToolNames::for_tools(&declared).map_err(|(a, b)| {
            DeclarationError(format!(
                "tools {a:?} and {b:?} have the same name in the program ({:?} in Python, {:?} in Bash)",
                crate::runtime::python_name(&b),
                crate::runtime::bash_name(&b)
            ))
        })?;
        let mut tools: Vec<Tool> = Vec::with_capacity(decls.len());
        for (decl, mut names) in decls.iter().zip(all_names) {
            let text = decl.parameters.as_ref().map(|p| p.get()).unwrap_or("null");
            let mut parameters: Value = serde_json::from_str(text)
                .map_err(|e| DeclarationError(format!("parameters of {:?}: {e}", decl.name)))?;
            if parameters.is_null() {
                parameters = serde_json::json!({"type": "object"});
            }
            if !parameters.is_object() {
                return err(format!("parameters of {:?} must be a JSON Schema object", decl.name));
            }
            // Before compiling: the bounds are what keep compilation (here, on an async
            // worker) and every later check cheap.
            check_schema(&parameters).map_err(|m| DeclarationError(format!("parameters of {:?}: {m}", decl.name)))?;
            lenient_types(&mut parameters);
            // Compiled here only to refuse a schema that does not compile; each check
            // compiles it again (see `Tool`).
            jsonschema::validator_for(&parameters).map_err(|e| {
                DeclarationError(format!(
                    "parameters of {:?} are not a valid JSON Schema: {e}",
                    decl.name
                ))
            })?;
            (names.params, names.required) = positional(property_order(text), &parameters);
            tools.push(Tool {
                names,
                schema: parameters.to_string().into(),
                mcp_server: decl.mcp_server.clone(),
            });
        }
        Ok(ToolSet { tools: tools.into() })
    }

    /// The MCP server a declared tool goes to, if it is one's (`ToolDecl::mcp_server`).
    pub fn mcp_server(&self, declared: &str) -> Option<&str> {
        self.tools
            .iter()
            .find(|t| t.names.declared == declared)
            .and_then(|t| t.mcp_server.as_deref())
    }

    /// The MCP servers the tools name, each once.
    pub fn mcp_servers(&self) -> Vec<&str> {
        let mut servers: Vec<&str> = self.tools.iter().filter_map(|t| t.mcp_server.as_deref()).collect();
        servers.sort_unstable();
        servers.dedup();
        servers
    }

    pub fn names(&self) -> Vec<ToolNames> {
        self.tools.iter().map(|t| t.names.clone()).collect()
    }

    /// Checks one call; returns the arguments to forward, or why it is refused. Its cost
    /// is bounded by the declaration's bounds and the argument size, but it can still
    /// take milliseconds: the driver runs it on a blocking thread.
    pub fn check(
        &self,
        name: &str,
        arguments: Option<Value>,
        argv: Option<Vec<String>>,
        budget: &ByteBudget,
    ) -> Result<Checked, CallError> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.names.declared == name)
            .ok_or_else(|| CallError::UnknownTool(name.to_owned()))?;
        let (schema, validator) = tool.schema()?;
        let arguments = match (arguments, argv) {
            (Some(Value::Null) | None, None) => Value::Object(Map::new()),
            (Some(v @ Value::Object(_)), None) => v,
            (Some(other), None) => {
                return Err(CallError::NotAnObject {
                    name: name.to_owned(),
                    got: other.to_string(),
                })
            }
            (None, Some(argv)) => arguments_from_argv(&argv, &schema)?,
            (Some(_), Some(_)) => return Err(CallError::ArgumentsAndArgv),
        };
        // The text forwarded is what is counted, so the budgets bound what the server
        // holds for the call.
        let text = serde_json::value::to_raw_value(&arguments).map_err(|source| CallError::Encode {
            name: name.to_owned(),
            source,
        })?;
        let size = text.get().len() as u64;
        if let Some(reason) = budget.refuse(name, size) {
            return Err(reason);
        }
        if let Some(error) = validator.iter_errors(&arguments).next() {
            let at = error.instance_path.to_string();
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(" at {at}")
            };
            return Err(CallError::Mismatch {
                name: name.to_owned(),
                at,
                error: error.to_string(),
            });
        }
        Ok(Checked { arguments: text, size })
    }
}

/// Why a tool call is refused (`ToolSet::check`); the program is told the reason.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("unknown tool {0:?}: it was not declared for this run")]
    UnknownTool(String),
    /// The declared schema, which compiled when declared, did not compile again (logged).
    #[error("the tool's schema could not be compiled")]
    SchemaBroken,
    #[error("arguments of {name} must be an object, got {got}")]
    NotAnObject { name: String, got: String },
    #[error(transparent)]
    Argv(#[from] ArgvError),
    #[error("a call carries either arguments or argv")]
    ArgumentsAndArgv,
    #[error("the arguments of {name} cannot be encoded: {source}")]
    Encode {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the arguments of {name} are {size} bytes, over the limit of {limit} (max_tool_call_bytes)")]
    OverCallLimit { name: String, size: u64, limit: u64 },
    #[error(
        "the arguments of {name} ({size} bytes) would take the tool calls of this pause over {limit} bytes (max_pause_bytes); \
         wait for the results of the calls already made"
    )]
    OverPauseLimit { name: String, size: u64, limit: u64 },
    #[error(
        "the arguments of {name} ({size} bytes) would take the tool calls of this session over {limit} bytes (max_session_tool_bytes)"
    )]
    OverSessionLimit { name: String, size: u64, limit: u64 },
    /// `at`: ` at <instance path>`, or empty for the arguments as a whole.
    #[error("the arguments of {name} do not match its schema{at}: {error}")]
    Mismatch { name: String, at: String, error: String },
}

/// Why Bash's words are not a tool call's arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvError {
    #[error("{0:?} is not a JSON object")]
    NotAnObject(String),
    #[error("argument {0:?} is not key=value (or pass one JSON object)")]
    NotKeyValue(String),
    /// The value does not parse as the type the schema gives the property.
    #[error("{key}: expected {expected}, got {raw:?}")]
    Mistyped {
        key: String,
        expected: &'static str,
        raw: String,
    },
    #[error("argument {0} is given twice")]
    Twice(String),
}

/// Why a tool's parameter schema is refused (`check_schema`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the schema is over {} bytes as JSON (the bound on one tool's parameters)",
        MAX_SCHEMA_BYTES
    )]
    TooLong,
    #[error(
        "with every $ref replaced by its target the schema holds more than {} JSON values \
         (the bound on one tool's expanded schema); shared $refs count once per use",
        MAX_SCHEMA_EXPANDED
    )]
    TooLarge,
    #[error(
        "the schema nests deeper than {} levels, counting through its $refs \
         (the bound on one tool's schema depth)",
        MAX_SCHEMA_DEPTH
    )]
    TooDeep,
    #[error("{0} is not supported in tool schemas (only at the root, for $id and $schema)")]
    ScopeKeyword(String),
    #[error("$ref must be a string")]
    RefNotString,
    #[error("only local $ref (\"#/...\") is supported, got {0:?}")]
    NotLocal(String),
    #[error("$ref {0:?} uses a %-escape, which is not supported")]
    PercentEscape(String),
    /// `path`: the `$ref`s being followed, joined with ` -> `; `again`: the one met again.
    #[error("Circular $ref detected: {path} -> {again}")]
    Circular { path: String, again: String },
    #[error("$ref {0:?} points at nothing")]
    Dangling(String),
}

/// Bash's forms: one JSON object, or `key=value` words whose values take the type the
/// schema gives the property (integer, number, boolean, array/object as JSON; else text).
pub fn arguments_from_argv(argv: &[String], schema: &Value) -> Result<Value, ArgvError> {
    if let [only] = argv {
        if only.trim_start().starts_with('{') {
            return match serde_json::from_str::<Value>(only) {
                Ok(v @ Value::Object(_)) => Ok(v),
                _ => Err(ArgvError::NotAnObject(only.clone())),
            };
        }
    }
    let mut map = Map::new();
    for word in argv {
        let (key, raw) = word
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| ArgvError::NotKeyValue(word.clone()))?;
        let bad = |expected: &'static str| ArgvError::Mistyped {
            key: key.to_owned(),
            expected,
            raw: raw.to_owned(),
        };
        let kind = schema.pointer(&format!(
            "/properties/{}/type",
            key.replace('~', "~0").replace('/', "~1")
        ));
        let value = match kind.and_then(Value::as_str) {
            Some("integer") => raw.parse::<i64>().map(Value::from).map_err(|_| bad("an integer"))?,
            Some("number") => raw
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| bad("a number"))?,
            Some("boolean") => match raw {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(bad("true or false")),
            },
            Some("array" | "object") => serde_json::from_str(raw).map_err(|_| bad("JSON"))?,
            _ => Value::String(raw.to_owned()),
        };
        if map.insert(key.to_owned(), value).is_some() {
            return Err(ArgvError::Twice(key.to_owned()));
        }
    }
    Ok(Value::Object(map))
}

/// Keywords that give a subschema a URI of its own, or resolve a reference through one.
/// Below the root they would make a `$ref` resolve elsewhere than the walk in
/// `check_schema` follows it, so they are refused; tool schemas have no use for them.
const SCOPE_KEYWORDS: [&str; 7] = [
    "$id",
    "$schema",
    "$anchor",
    "$dynamicAnchor",
    "$dynamicRef",
    "$recursiveAnchor",
    "$recursiveRef",
];

/// Refuses a schema that is over one of the bounds (`MAX_SCHEMA_BYTES`,
/// `MAX_SCHEMA_EXPANDED`, `MAX_SCHEMA_DEPTH`), whose local `$ref`s form a cycle (it
/// cannot be called with a finite description), or with a `$ref` that is not local.
///
/// The expanded size is counted by following every `$ref` each time it is met, without
/// memoising, which is exactly the size that costs work later; the walk stops as soon as
/// it passes the bound, so the check itself costs at most `MAX_SCHEMA_EXPANDED` steps.
pub fn check_schema(root: &Value) -> Result<(), SchemaError> {
    if json_len_over(root, MAX_SCHEMA_BYTES) {
        return Err(SchemaError::TooLong);
    }
    // In drafts 3 and 4 the keyword `$id` was spelled `id`.
    let old_draft = root
        .get("$schema")
        .and_then(Value::as_str)
        .is_some_and(|s| s.contains("draft-04") || s.contains("draft-03"));
    Walk {
        root,
        visited: 0,
        refs: Vec::new(),
        old_draft,
    }
    .visit(root, 1, true)
}

/// Whether `value`, as compact JSON, is longer than `max` bytes (counted, not built).
fn json_len_over(value: &Value, max: usize) -> bool {
    struct Count(usize, usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            if self.0 > self.1 {
                return Err(std::io::Error::other("over the bound"));
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Count(0, max), value).is_err()
}

struct Walk<'a> {
    root: &'a Value,
    /// Values visited so far, every `$ref` expanded where it is met.
    visited: usize,
    /// The `$ref`s being followed, outermost first: meeting one of them again is a cycle.
    refs: Vec<&'a str>,
    old_draft: bool,
}

impl<'a> Walk<'a> {
    fn visit(&mut self, node: &'a Value, depth: usize, at_root: bool) -> Result<(), SchemaError> {
        self.visited += 1;
        if self.visited > MAX_SCHEMA_EXPANDED {
            return Err(SchemaError::TooLarge);
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(SchemaError::TooDeep);
        }
        match node {
            Value::Object(map) => {
                for (key, value) in map {
                    if key == "$ref" {
                        self.follow(value, depth)?;
                        continue;
                    }
                    let scope =
                        SCOPE_KEYWORDS.contains(&key.as_str()) || (self.old_draft && key == "id" && value.is_string());
                    if scope && !(at_root && matches!(key.as_str(), "$id" | "id" | "$schema")) {
                        return Err(SchemaError::ScopeKeyword(key.clone()));
                    }
                    self.visit(value, depth + 1, false)?;
                }
                Ok(())
            }
            Value::Array(items) => items.iter().try_for_each(|v| self.visit(v, depth + 1, false)),
            _ => Ok(()),
        }
    }

    fn follow(&mut self, reference: &'a Value, depth: usize) -> Result<(), SchemaError> {
        let r = reference.as_str().ok_or(SchemaError::RefNotString)?;
        let pointer = r.strip_prefix('#').ok_or_else(|| SchemaError::NotLocal(r.to_owned()))?;
        // The validator percent-decodes a reference and this walk does not: refused, so
        // that both always reach the same target.
        if r.contains('%') {
            return Err(SchemaError::PercentEscape(r.to_owned()));
        }
        if self.refs.contains(&r) {
            return Err(SchemaError::Circular {
                path: self.refs.join(" -> "),
                again: r.to_owned(),
            });
        }
        let target = self
            .root
            .pointer(pointer)
            .ok_or_else(|| SchemaError::Dangling(r.to_owned()))?;
        self.refs.push(r);
        self.visit(target, depth + 1, false)?;
        self.refs.pop();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decl(name: &str, parameters: Value) -> sandcall_api::ToolDecl {
        sandcall_api::ToolDecl {
            name: name.into(),
            description: None,
            parameters: Some(serde_json::value::to_raw_value(&parameters).unwrap()),
            mcp_server: None,
        }
    }

    /// `d0: allOf[$ref d1, $ref d1]`, ... `d{depth}: {type: object}`: acyclic, and
    /// 2^depth subschemas once expanded.
    fn dag(depth: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..depth {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(format!("d{i}"), json!({"allOf": [{"$ref": next}, {"$ref": next}]}));
        }
        defs.insert(format!("d{depth}"), json!({"type": "object"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    fn budget(max_call: u64) -> ByteBudget {
        ByteBudget {
            max_call,
            max_pause: u64::MAX,
            pause_used: 0,
            max_session: u64::MAX,
            session_used: 0,
        }
    }

    fn args(checked: Result<Checked, CallError>) -> Value {
        serde_json::from_str(checked.unwrap().arguments.get()).unwrap()
    }

    #[test]
    fn circular_refs_are_refused_and_dags_are_not() {
        let circular = json!({"$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"});
        assert!(check_schema(&circular)
            .unwrap_err()
            .to_string()
            .contains("Circular $ref detected"));
        let mutual = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"items": {"$ref": "#/$defs/a"}}}});
        assert!(check_schema(&mutual)
            .unwrap_err()
            .to_string()
            .contains("Circular $ref detected"));
        let shared = json!({"$defs": {"s": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/s"}, "y": {"$ref": "#/$defs/s"}}});
        assert!(check_schema(&shared).is_ok());
        assert!(check_schema(&json!({"$ref": "http://example.invalid/s.json"})).is_err());
        assert!(check_schema(&json!({"$defs": {"a b": {}}, "$ref": "#/$defs/a%20b"})).is_err());
        let err = ToolSet::declare(&[decl("t", circular)]).err().unwrap();
        assert!(err.0.contains("Circular $ref detected"), "{}", err.0);
    }

    #[test]
    fn expanded_size_is_bounded_and_counted_per_use() {
        // d0 expands to 6 * 2^depth - 4 values; it is met three times (from the root's
        // $ref, as the definition itself, and the definitions below it add about as
        // much again): depth 9 is just under the bound, depth 10 over it.
        assert!(check_schema(&dag(9)).is_ok());
        // Each level of the DAG nests three deep (object, allOf, the $ref's object):
        // from 21 levels on the path to the bottom passes the depth bound first.
        for (depth, bound) in [
            (10, "10000 JSON values"),
            (20, "10000 JSON values"),
            (26, "deeper than 64"),
            (60, "deeper than 64"),
        ] {
            let started = std::time::Instant::now();
            let err = check_schema(&dag(depth)).unwrap_err().to_string();
            assert!(err.contains(bound), "{err}");
            // The check stops at the bound: it does not do the exponential work itself.
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "{:?}",
                started.elapsed()
            );
        }
        let err = ToolSet::declare(&[decl("t", dag(20))]).err().unwrap();
        assert!(
            err.0.starts_with("parameters of \"t\": with every $ref replaced"),
            "{}",
            err.0
        );
        // Shared definitions count once per use: 2,000 uses of a 6-value definition.
        let uses: Map<String, Value> = (0..2000)
            .map(|i| (format!("p{i}"), json!({"$ref": "#/$defs/s"})))
            .collect();
        let wide = json!({"$defs": {"s": {"type": "string", "minLength": 1, "maxLength": 9}}, "properties": uses});
        assert!(check_schema(&wide)
            .unwrap_err()
            .to_string()
            .contains("10000 JSON values"));
    }

    #[test]
    fn depth_and_bytes_are_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(check_schema(&deep).unwrap_err().to_string().contains("deeper than 64"));
        // Depth counts through $refs: a chain of 70 references, each one level.
        let mut defs = Map::new();
        for i in 0..70 {
            defs.insert(format!("r{i}"), json!({"$ref": format!("#/$defs/r{}", i + 1)}));
        }
        defs.insert("r70".into(), json!({}));
        let chain = json!({"$defs": defs, "$ref": "#/$defs/r0"});
        assert!(check_schema(&chain).unwrap_err().to_string().contains("deeper than 64"));
        let big = json!({"description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(check_schema(&big).unwrap_err().to_string().contains("65536 bytes"));
    }

    #[test]
    fn realistic_schemas_are_within_the_bounds() {
        // 200 described properties, a shared definition used twice, an enum.
        let mut properties: Map<String, Value> = (0..200)
            .map(|i| {
                (
                    format!("field_{i}"),
                    json!({"type": "string", "description": format!("The value of field number {i} of the record.")}),
                )
            })
            .collect();
        properties.insert("price".into(), json!({"$ref": "#/$defs/money"}));
        properties.insert("cost".into(), json!({"$ref": "#/$defs/money"}));
        properties.insert("currency".into(), json!({"enum": ["USD", "EUR", "GBP", "JPY", "CHF"]}));
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"money": {"type": "object", "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}}, "required": ["amount", "currency"]}},
            "properties": properties,
            "required": ["price"],
        });
        assert!(serde_json::to_vec(&schema).unwrap().len() > 15_000);
        let tools = ToolSet::declare(&[decl("record", schema)]).unwrap();
        let ok = json!({"price": {"amount": 1.5, "currency": "EUR"}, "field_7": "x"});
        assert_eq!(args(tools.check("record", Some(ok.clone()), None, &budget(1000))), ok);
        let bad = json!({"price": {"amount": "1.5", "currency": "EUR"}});
        assert!(tools
            .check("record", Some(bad), None, &budget(1000))
            .err()
            .unwrap()
            .to_string()
            .contains("/price/amount"));
    }

    #[test]
    fn keywords_that_move_references_are_refused_below_the_root() {
        for schema in [
            json!({"properties": {"a": {"$id": "https://example.invalid/a", "$defs": {"x": {}}, "$ref": "#/$defs/x"}}}),
            json!({"properties": {"a": {"$dynamicRef": "#meta"}}}),
            json!({"properties": {"a": {"$recursiveRef": "#"}}}),
            json!({"properties": {"a": {"$schema": "http://json-schema.org/draft-04/schema#"}}}),
            json!({"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"a": {"id": "sub", "definitions": {}}}}),
        ] {
            assert!(
                check_schema(&schema).unwrap_err().to_string().contains("not supported"),
                "{schema}"
            );
        }
        // At the root they are harmless, and a property may be called `id`.
        assert!(check_schema(&json!({"$id": "https://example.invalid/t", "$schema": "https://json-schema.org/draft/2020-12/schema", "properties": {"id": {"type": "string"}}})).is_ok());
        assert!(check_schema(
            &json!({"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"id": {"type": "string"}}})
        )
        .is_ok());
    }

    #[test]
    fn calls_are_checked_against_the_schema_and_the_size_cap() {
        let tools = ToolSet::declare(&[decl(
            "get_rate",
            json!({"type": "object", "properties": {"base": {"type": "string"}}, "required": ["base"]}),
        )])
        .unwrap();
        assert_eq!(
            args(tools.check("get_rate", Some(json!({"base": "USD"})), None, &budget(1000))),
            json!({"base": "USD"})
        );
        assert!(tools
            .check("get_rate", Some(json!({"base": 5})), None, &budget(1000))
            .err()
            .unwrap()
            .to_string()
            .contains("do not match"));
        assert!(tools
            .check("get_rate", Some(json!({})), None, &budget(1000))
            .err()
            .unwrap()
            .to_string()
            .contains("base"));
        assert!(tools
            .check("nope", Some(json!({})), None, &budget(1000))
            .err()
            .unwrap()
            .to_string()
            .contains("not declared"));
        let big = json!({"base": "x".repeat(2000)});
        assert!(tools
            .check("get_rate", Some(big), None, &budget(1000))
            .err()
            .unwrap()
            .to_string()
            .contains("max_tool_call_bytes"));
    }

    #[test]
    fn pause_and_session_budgets_count_the_forwarded_text() {
        let tools = ToolSet::declare(&[decl("t", json!({}))]).unwrap();
        let call = json!({"s": "x".repeat(100)}); // 108 bytes as compact JSON
        let mut b = budget(1000);
        let checked = tools.check("t", Some(call.clone()), None, &b).ok().unwrap();
        assert_eq!(checked.size, 108);
        b.max_pause = 200;
        b.pause_used = 100;
        let err = tools
            .check("t", Some(call.clone()), None, &b)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("max_pause_bytes"), "{err}");
        b.pause_used = 92;
        assert!(tools.check("t", Some(call.clone()), None, &b).is_ok());
        b.max_session = 1000;
        b.session_used = 900;
        let err = tools.check("t", Some(call), None, &b).err().unwrap().to_string();
        assert!(err.contains("max_session_tool_bytes"), "{err}");
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
        let err = ToolSet::declare(&[decl("a-b", json!({})), decl("a_b", json!({}))])
            .err()
            .unwrap();
        assert!(err.0.contains("\"a-b\" and \"a_b\""), "{}", err.0);
        // `.` is dropped in Python and `_` in Bash: these two are one name in Bash.
        assert!(ToolSet::declare(&[decl("a.b", json!({})), decl("a-b", json!({}))]).is_err());
        // Any characters but control characters, up to 128.
        assert!(ToolSet::declare(&[decl("bad;name", json!({}))]).is_ok());
        assert!(ToolSet::declare(&[decl("tab\tname", json!({}))]).is_err());
        assert!(ToolSet::declare(&[decl("wide\u{3000}space é", json!({}))]).is_ok());
        assert!(ToolSet::declare(&[decl("nl\nname", json!({}))]).is_err());
        assert!(ToolSet::declare(&[decl(&"x".repeat(128), json!({}))]).is_ok());
        assert!(ToolSet::declare(&[decl(&"x".repeat(129), json!({}))]).is_err());
        assert!(ToolSet::declare(&[decl("", json!({}))]).is_err());
        let many: Vec<_> = (0..101).map(|i| decl(&format!("t{i}"), json!({}))).collect();
        assert!(ToolSet::declare(&many).is_err());
    }

    #[test]
    fn unknown_types_are_read_leniently() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "price": {"type": "float"},
                "count": {"type": "int"},
                "label": {"type": "str"},
                "flag": {"type": "bool"},
                "either": {"type": ["float", "null"]},
                "list": {"type": "array", "items": {"type": "double"}},
                "nested": {"anyOf": [{"type": "decimal"}, {"type": "string"}]},
                "type": {"type": "string", "description": "a property called type"},
            },
            "$defs": {"d": {"type": "float"}},
        });
        lenient_types(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["price"]["type"], "number");
        assert_eq!(p["count"]["type"], "integer");
        assert_eq!(p["label"]["type"], "string");
        assert_eq!(p["flag"]["type"], "boolean");
        assert_eq!(p["either"]["type"], json!(["number", "null"]));
        assert_eq!(p["list"]["items"]["type"], "number");
        assert_eq!(p["nested"]["anyOf"][0]["type"], "number");
        assert_eq!(p["type"]["type"], "string");
        assert_eq!(schema["$defs"]["d"]["type"], "number");
        // Declared as LibreChat writes them: accepted, and checked as numbers.
        let tools = ToolSet::declare(&[decl(
            "price",
            json!({"type": "object", "properties": {"amount": {"type": "float"}}, "required": ["amount"]}),
        )])
        .unwrap();
        assert!(tools
            .check("price", Some(json!({"amount": 1.5})), None, &budget(1000))
            .is_ok());
        assert!(tools
            .check("price", Some(json!({"amount": "1.5"})), None, &budget(1000))
            .is_err());
        // Bash words take the lenient type too.
        assert_eq!(
            args(tools.check("price", None, Some(vec!["amount=2.5".into()]), &budget(1000))),
            json!({"amount": 2.5})
        );
    }

    #[test]
    fn positional_order_is_required_first_in_the_schemas_order() {
        let text =
            r#"{"type":"object","properties":{"zeta":{},"alpha":{},"mid":{},"beta":{}},"required":["mid","zeta"]}"#;
        assert_eq!(property_order(text), vec!["zeta", "alpha", "mid", "beta"]);
        let tools = ToolSet::declare(&[sandcall_api::ToolDecl {
            name: "t".into(),
            description: None,
            parameters: Some(serde_json::value::RawValue::from_string(text.into()).unwrap()),
            mcp_server: None,
        }])
        .unwrap();
        let names = &tools.names()[0];
        assert_eq!(names.params, vec!["zeta", "mid", "alpha", "beta"]);
        assert_eq!(names.required, 2);
        assert!(property_order("{}").is_empty());
        assert!(property_order(r#"{"properties": 5}"#).is_empty());
    }
}
