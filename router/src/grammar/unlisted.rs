//! What a JSON schema's object means by the properties it does not list. JSON Schema allows
//! them unless `additionalProperties` says otherwise, and a model constrained by the letter of
//! that keeps adding keys until its token budget ends (`{"name": "...", "age": 3, "x": ...`):
//! ordinary schemas, written for the keys they list, come back cut off. vLLM's default backend
//! (xgrammar) reads an object that lists its properties as closed, and so does this server by
//! default (`--grammar-unlisted-properties forbid`): such an object without
//! `additionalProperties`, `patternProperties` or `unevaluatedProperties` gets
//! `"additionalProperties": false`. A schema keeps the permissive reading for an object by
//! saying `"additionalProperties": true`, and the server for all with `allow`.
//!
//! Only schema positions are walked (`properties`, `items`, `anyOf`, `$defs`, ...), never data
//! (`enum`, `const`, `default`, `examples`). An object composed with `allOf` (at its own level
//! or as one of the branches) is left open: each part lists only some of the properties, and
//! closing one part would refuse the others'.
use serde_json::{Map, Value};

/// The server's reading of an object schema's unlisted properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UnlistedProperties {
    /// Closed: only the listed properties (vLLM's default).
    #[default]
    Forbid,
    /// JSON Schema's letter: any other property too.
    Allow,
}

/// Keywords whose value is one subschema.
const ONE: [&str; 7] = ["additionalProperties", "items", "contains", "not", "if", "then", "else"];
/// Keywords whose value is a list of subschemas.
const LIST: [&str; 3] = ["anyOf", "oneOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const MAP: [&str; 5] = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];

/// `schema` with every object that lists its properties closed, as described above.
pub fn close_listed_objects(mut schema: Value) -> Value {
    close(&mut schema, false);
    schema
}

/// `composed`: this schema is one branch of an `allOf`, whose siblings may list more properties.
fn close(schema: &mut Value, composed: bool) {
    let Value::Object(object) = schema else { return };
    if !composed && lists_its_properties(object) {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    for keyword in ONE {
        if let Some(sub) = object.get_mut(keyword) {
            close(sub, false);
        }
    }
    for keyword in LIST {
        if let Some(Value::Array(subs)) = object.get_mut(keyword) {
            subs.iter_mut().for_each(|sub| close(sub, false));
        }
    }
    if let Some(Value::Array(parts)) = object.get_mut("allOf") {
        parts.iter_mut().for_each(|part| close(part, true));
    }
    if let Some(Value::Array(items)) = object.get_mut("items") {
        items.iter_mut().for_each(|sub| close(sub, false)); // draft-04 tuple form
    }
    for keyword in MAP {
        if let Some(Value::Object(subs)) = object.get_mut(keyword) {
            subs.values_mut().for_each(|sub| close(sub, false));
        }
    }
}

fn lists_its_properties(object: &Map<String, Value>) -> bool {
    object.get("properties").is_some_and(Value::is_object)
        && !["additionalProperties", "patternProperties", "unevaluatedProperties", "allOf"]
            .iter()
            .any(|keyword| object.contains_key(*keyword))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_that_list_their_properties_are_closed_at_every_depth() {
        let schema = json!({
            "type": "object",
            "properties": {
                "person": {"type": "object", "properties": {"name": {"type": "string"}}},
                "tags": {"type": "array", "items": {"properties": {"t": {"type": "string"}}}},
                "either": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]},
                "ref": {"$ref": "#/$defs/point"},
            },
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        });
        let closed = close_listed_objects(schema);
        for pointer in ["", "/properties/person", "/properties/tags/items", "/properties/either/anyOf/0", "/$defs/point"] {
            assert_eq!(closed.pointer(&format!("{pointer}/additionalProperties")), Some(&json!(false)), "{pointer}");
        }
        assert_eq!(closed.pointer("/properties/either/anyOf/1"), Some(&json!({"type": "null"})));
    }

    #[test]
    fn what_the_schema_says_and_data_are_left_alone() {
        let open = json!({"properties": {"a": {}}, "additionalProperties": true});
        assert_eq!(close_listed_objects(open.clone()), open);
        let typed = json!({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}});
        assert_eq!(close_listed_objects(typed.clone()), typed);
        let patterned = json!({"properties": {"a": {}}, "patternProperties": {"^x-": {}}});
        assert_eq!(close_listed_objects(patterned.clone()), patterned);
        // A free-form object lists nothing: it stays any object.
        assert_eq!(close_listed_objects(json!({"type": "object"})), json!({"type": "object"}));
        // Data that looks like a schema is data.
        let data = json!({"enum": [{"properties": {"a": 1}}], "const": {"properties": {}}, "default": {"properties": {}}});
        assert_eq!(close_listed_objects(data.clone()), data);
    }

    #[test]
    fn composed_objects_stay_open_and_their_parts_nested_schemas_are_closed() {
        let schema = json!({
            "allOf": [
                {"properties": {"a": {"type": "object", "properties": {"deep": {}}}}},
                {"properties": {"b": {}}},
            ],
        });
        let closed = close_listed_objects(schema);
        assert_eq!(closed.pointer("/allOf/0/additionalProperties"), None);
        assert_eq!(closed.pointer("/allOf/1/additionalProperties"), None);
        assert_eq!(closed.pointer("/allOf/0/properties/a/additionalProperties"), Some(&json!(false)));
        let sibling = json!({"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]});
        assert_eq!(close_listed_objects(sibling.clone()).get("additionalProperties"), None);
    }
}
