//! What a client asks to constrain its output to, as TGI's `grammar` and OpenAI's
//! `response_format` spell it, checked before anything is compiled.
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A grammar to compile: a JSON schema (the output is one JSON value it accepts) or a regex
/// (the whole output matches it).
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    JsonSchema(Value),
    Regex(String),
}

/// TGI's `grammar` parameter: `{"type": "json" | "json_object" | "regex", "value": ...}`; a
/// JSON schema may also be given as a string holding it (as TGI accepts).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", content = "value", deny_unknown_fields)]
enum TgiGrammar {
    #[serde(rename = "json", alias = "json_object")]
    Json(Value),
    #[serde(rename = "regex")]
    Regex(String),
}

/// OpenAI's `response_format`, plus TGI's own spellings of it (`json` and `regex` with a
/// `value`, which `huggingface_hub` sends).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
    Json { value: Value },
    Regex { value: String },
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    /// OpenAI makes it optional: without one, any JSON object.
    #[serde(default)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// vLLM's structured outputs, as `structured_outputs` carries them (the older top-level
/// `guided_json`, `guided_regex` and `guided_choice` are read into one). vLLM's `grammar` and
/// `structural_tag` are refused by name, not ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (or a string holding one).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub json: Option<Value>,
    #[serde(default)]
    pub json_object: Option<bool>,
    #[serde(default)]
    pub regex: Option<String>,
    /// The answer is exactly one of these strings.
    #[serde(default)]
    pub choice: Option<Vec<String>>,
}

/// Any JSON object: what `json_object` asks for.
fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

impl GrammarSpec {
    /// Parses TGI's `grammar` value; the error is the reason shown to the client.
    pub fn from_tgi(grammar: &Value) -> Result<Self, String> {
        match TgiGrammar::deserialize(grammar).map_err(|error| error.to_string())? {
            TgiGrammar::Json(Value::String(text)) => serde_json::from_str(&text)
                .map(GrammarSpec::JsonSchema)
                .map_err(|error| format!("the JSON schema is not JSON: {error}")),
            TgiGrammar::Json(schema) => Ok(GrammarSpec::JsonSchema(schema)),
            TgiGrammar::Regex(regex) => Ok(GrammarSpec::Regex(regex)),
        }
    }

    /// The grammar a `response_format` asks for; `None` for plain text.
    pub fn from_response_format(format: &Value) -> Result<Option<Self>, String> {
        let format = ResponseFormat::deserialize(format).map_err(|error| error.to_string())?;
        Ok(match format {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(GrammarSpec::JsonSchema(any_object())),
            ResponseFormat::JsonSchema { json_schema } => {
                Some(GrammarSpec::JsonSchema(json_schema.schema.unwrap_or_else(any_object)))
            }
            ResponseFormat::Json { value } => Some(Self::from_tgi(&serde_json::json!({"type": "json", "value": value}))?),
            ResponseFormat::Regex { value } => Some(GrammarSpec::Regex(value)),
        })
    }

    /// vLLM's structured outputs (`structured_outputs`, or the older `guided_*` fields); `None`
    /// when none is asked for. At most one constraint may be given.
    pub fn from_structured_outputs(outputs: &StructuredOutputs) -> Result<Option<Self>, String> {
        let mut specs = Vec::new();
        if let Some(schema) = &outputs.json {
            specs.push(Self::from_tgi(&serde_json::json!({"type": "json", "value": schema}))?);
        }
        if outputs.json_object == Some(true) {
            specs.push(GrammarSpec::JsonSchema(any_object()));
        }
        if let Some(regex) = &outputs.regex {
            specs.push(GrammarSpec::Regex(regex.clone()));
        }
        if let Some(choices) = &outputs.choice {
            specs.push(Self::choice(choices)?);
        }
        match specs.len() {
            0 | 1 => Ok(specs.pop()),
            _ => Err("give one of `json`, `json_object`, `regex` and `choice`".into()),
        }
    }

    /// Exactly one of the strings (vLLM's `choice`).
    pub fn choice(choices: &[String]) -> Result<Self, String> {
        if choices.is_empty() {
            return Err("`choice` needs at least one string".into());
        }
        let alternatives: Vec<String> = choices.iter().map(|choice| regex_syntax::escape(choice)).collect();
        Ok(GrammarSpec::Regex(format!("({})", alternatives.join("|"))))
    }

    /// The value TGI's `grammar` parameter carries for this spec (how the OpenAI routes hand a
    /// `response_format` to the common validation).
    pub fn to_tgi(&self) -> Value {
        match self {
            GrammarSpec::JsonSchema(schema) => serde_json::json!({"type": "json", "value": schema}),
            GrammarSpec::Regex(regex) => serde_json::json!({"type": "regex", "value": regex}),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_choice_is_its_strings_escaped_as_alternatives() {
        let choices = vec!["a.b".to_string(), "c|d".to_string(), "(e)".to_string()];
        assert_eq!(GrammarSpec::choice(&choices), Ok(GrammarSpec::Regex(r"(a\.b|c\|d|\(e\))".into())));
        assert!(GrammarSpec::choice(&[]).is_err());
        let outputs = StructuredOutputs { regex: Some("x".into()), ..StructuredOutputs::default() };
        assert_eq!(GrammarSpec::from_structured_outputs(&outputs), Ok(Some(GrammarSpec::Regex("x".into()))));
        assert_eq!(GrammarSpec::from_structured_outputs(&StructuredOutputs::default()), Ok(None));
        let two = StructuredOutputs { json_object: Some(true), ..outputs };
        assert!(GrammarSpec::from_structured_outputs(&two).is_err());
    }

    #[test]
    fn tgi_grammars_parse_with_their_aliases_and_string_schemas() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        for grammar in [
            json!({"type": "json", "value": schema}),
            json!({"type": "json_object", "value": schema}),
            json!({"type": "json", "value": schema.to_string()}),
        ] {
            assert_eq!(GrammarSpec::from_tgi(&grammar), Ok(GrammarSpec::JsonSchema(schema.clone())));
        }
        assert_eq!(
            GrammarSpec::from_tgi(&json!({"type": "regex", "value": "a+"})),
            Ok(GrammarSpec::Regex("a+".into()))
        );
    }

    #[test]
    fn malformed_tgi_grammars_say_why() {
        let unknown = GrammarSpec::from_tgi(&json!({"type": "lark", "value": "start: /a/"})).unwrap_err();
        assert!(unknown.contains("unknown variant `lark`"), "{unknown}");
        let not_text = GrammarSpec::from_tgi(&json!({"type": "regex", "value": 3})).unwrap_err();
        assert!(not_text.contains("invalid type"), "{not_text}");
        let not_json = GrammarSpec::from_tgi(&json!({"type": "json", "value": "{nope"})).unwrap_err();
        assert!(not_json.starts_with("the JSON schema is not JSON"), "{not_json}");
        assert!(GrammarSpec::from_tgi(&json!({"type": "json"})).is_err());
    }

    #[test]
    fn openai_response_formats_map_to_grammars() {
        let schema = json!({"type": "array", "items": {"type": "boolean"}});
        let cases = [
            (json!({"type": "text"}), None),
            (json!({"type": "json_object"}), Some(GrammarSpec::JsonSchema(json!({"type": "object"})))),
            (json!({"type": "json_schema", "json_schema": {"name": "flags", "schema": schema, "strict": true}}),
                Some(GrammarSpec::JsonSchema(schema.clone()))),
            (json!({"type": "json_schema", "json_schema": {"name": "any"}}),
                Some(GrammarSpec::JsonSchema(json!({"type": "object"})))),
            (json!({"type": "json", "value": schema}), Some(GrammarSpec::JsonSchema(schema.clone()))),
            (json!({"type": "regex", "value": "[0-9]+"}), Some(GrammarSpec::Regex("[0-9]+".into()))),
        ];
        for (format, expected) in cases {
            assert_eq!(GrammarSpec::from_response_format(&format), Ok(expected), "{format}");
        }
        assert!(GrammarSpec::from_response_format(&json!({"type": "xml"})).is_err());
        assert!(GrammarSpec::from_response_format(&json!({"type": "json_schema"})).is_err());
    }

    #[test]
    fn a_spec_round_trips_through_tgis_parameter() {
        for spec in [GrammarSpec::JsonSchema(json!({"enum": [1, 2]})), GrammarSpec::Regex("x|y".into())] {
            assert_eq!(GrammarSpec::from_tgi(&spec.to_tgi()), Ok(spec));
        }
    }
}
