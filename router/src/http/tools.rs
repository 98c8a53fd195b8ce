//! OpenAI tool calls on `/v1/chat/completions`, generated under a grammar as TGI does: the
//! request's `tools` and `tool_choice` become one JSON schema, `{"function": {"_name": <a
//! tool's name>, <its arguments>}}` (with `auto`, also the `no_tool` answer `{"_name":
//! "no_tool", "content": <text>}`); the conversation's last message gets TGI's tool prompt and
//! the tools; the output is parsed back into OpenAI's `tool_calls` (arguments as a JSON string).
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::openai_stream::PerChoice;
use super::tool_parser::{ToolCallParser, ToolCallSplitter};
use crate::grammar::GrammarSpec;
use crate::validation::ValidationError;

/// How a chat reply's tool calls are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolReading {
    /// No tool is offered (none given, or `tool_choice: "none"`).
    None,
    /// One call (or, with `auto`, TGI's `no_tool` answer) generated under TGI's grammar.
    Grammar,
    /// `auto` under `--tool-call-parser`, with a template that writes the tools into the prompt:
    /// the reply is generated freely and any number of calls are read out of it in the model's
    /// own format (`tool_parser`); `single`: at most one (`parallel_tool_calls: false`).
    Parser { parser: ToolCallParser, single: bool },
}

impl ToolReading {
    /// The reading of a request's `tools` and `tool_choice`, given the server's parser and
    /// whether its chat template writes the tools (a model that is not shown them cannot call
    /// them in its own format, so it gets TGI's instruction and grammar instead). Tools that do
    /// not validate read as none: `plan` refuses them.
    pub fn of(tools: Option<&Value>, tool_choice: Option<&Value>, parallel: bool, parser: Option<ToolCallParser>, renders_tools: bool) -> Self {
        if tools.and_then(Value::as_array).is_none_or(|tools| tools.is_empty()) {
            return ToolReading::None;
        }
        match ToolChoice::parse(tool_choice) {
            Ok(ToolChoice::None) | Err(_) => ToolReading::None,
            Ok(ToolChoice::Auto) => parser
                .filter(|_| renders_tools)
                .map_or(ToolReading::Grammar, |parser| ToolReading::Parser { parser, single: !parallel }),
            Ok(ToolChoice::Required | ToolChoice::Function(_)) => ToolReading::Grammar,
        }
    }

    /// Under a parser, a reading of the reply's calls in the model's format, as many as it may
    /// give out.
    pub fn splitter(self) -> Option<ToolCallSplitter> {
        match self {
            ToolReading::Parser { parser, single } => Some(ToolCallSplitter::new(parser, if single { 1 } else { u32::MAX })),
            ToolReading::None | ToolReading::Grammar => None,
        }
    }

    /// The state a stream's replies have their calls read with.
    pub fn stream(self) -> Option<ToolStream> {
        (self != ToolReading::None).then(|| ToolStream { reading: self, choices: PerChoice::default() })
    }
}

/// A stream's tool-call reading (`ToolReading::stream`): each choice's own, by its index.
#[derive(Debug)]
pub struct ToolStream {
    reading: ToolReading,
    choices: PerChoice<ChoiceCalls>,
}

/// One streamed choice's reading of its calls.
#[derive(Debug)]
pub enum ChoiceCalls {
    Grammar(CallStream),
    Parser(ToolCallSplitter),
}

impl ToolStream {
    /// Runs `read` on choice `index`'s reading (begun at its first piece); its `last` piece
    /// ends it.
    pub fn with<R>(&self, index: u32, last: bool, read: impl FnOnce(&mut ChoiceCalls) -> R) -> R {
        let begin = || match self.reading.splitter() {
            Some(splitter) => ChoiceCalls::Parser(splitter),
            None => ChoiceCalls::Grammar(CallStream::default()),
        };
        self.choices.with(index, last, begin, read)
    }
}

/// TGI's default instruction, followed by the tools as JSON.
pub const DEFAULT_TOOL_PROMPT: &str = "Given the functions available, please respond with a JSON for a function call \
with its proper arguments that best answers the given prompt. Respond in the format {name: function name, parameters: \
dictionary of argument name and its value}.Do not use variables.";

/// The `_name` of the answer that calls no tool (`tool_choice: "auto"`).
const NO_TOOL: &str = "no_tool";

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON schema of the arguments; none: no arguments.
    #[serde(default, alias = "arguments")]
    pub parameters: Option<Value>,
}

/// `tool_choice`: `"auto"` (the default with tools), `"none"`, `"required"`, or
/// `{"type": "function", "function": {"name": …}}`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

impl ToolChoice {
    fn parse(value: Option<&Value>) -> Result<Self, String> {
        match value {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(choice)) => match choice.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(format!("unknown tool_choice `{other}`")),
            },
            Some(value) => value["function"]["name"]
                .as_str()
                .map(|name| ToolChoice::Function(name.to_string()))
                .ok_or_else(|| "tool_choice must be \"auto\", \"none\", \"required\" or a named function".into()),
        }
    }
}

/// What a request's tools make of it: the grammar, and the text added to its last message.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub grammar: GrammarSpec,
    pub prompt_suffix: String,
}

/// The plan for `tools` and `tool_choice`; `None` when the request calls no tool (no tools,
/// or `tool_choice: "none"`).
pub fn plan(tools: Option<&Value>, tool_choice: Option<&Value>, tool_prompt: Option<&str>) -> Result<Option<ToolPlan>, ValidationError> {
    let invalid = |why: String| ValidationError::InvalidTools(why);
    let tools: Vec<Tool> = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(tools) => serde_json::from_value(tools.clone()).map_err(|error| invalid(error.to_string()))?,
    };
    let choice = ToolChoice::parse(tool_choice).map_err(invalid)?;
    if tools.is_empty() || choice == ToolChoice::None {
        return Ok(None);
    }
    let offered: Vec<&Tool> = match &choice {
        ToolChoice::Function(name) => {
            let tool = tools.iter().find(|tool| &tool.function.name == name);
            vec![tool.ok_or_else(|| invalid(format!("tool_choice names `{name}`, which is not among the tools")))?]
        }
        _ => tools.iter().collect(),
    };
    let mut defs = Map::new();
    let mut alternatives: Vec<Value> = offered.iter().map(|tool| call_schema(&tool.function, &mut defs)).collect();
    if choice == ToolChoice::Auto {
        alternatives.push(object_schema(NO_TOOL, json!({"content": {"type": "string",
            "description": "The response content"}}), vec!["content".into()]));
    }
    let mut schema = json!({"type": "object", "properties": {"function": {"anyOf": alternatives}},
        "required": ["function"], "additionalProperties": false});
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    let described: Vec<Value> = tools.iter().map(|tool| json!({"type": tool.kind, "function": {
        "name": tool.function.name, "description": tool.function.description,
        "parameters": tool.function.parameters}})).collect();
    let listing = serde_json::to_string(&described).map_err(|error| invalid(error.to_string()))?;
    Ok(Some(ToolPlan {
        grammar: GrammarSpec::JsonSchema(schema),
        prompt_suffix: format!("\n---\n{}\n{listing}", tool_prompt.unwrap_or(DEFAULT_TOOL_PROMPT)),
    }))
}

/// `{"_name": const name, <the function's parameters>}`; the parameters' own `$defs` move to
/// the root, where their `#/$defs/…` references point.
fn call_schema(function: &FunctionDefinition, defs: &mut Map<String, Value>) -> Value {
    let mut parameters = function.parameters.clone().unwrap_or_else(|| json!({}));
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(own)) = parameters.as_object_mut().and_then(|object| object.remove(key)) {
            defs.extend(own);
        }
    }
    let properties = parameters.get("properties").cloned().unwrap_or_else(|| json!({}));
    let required = parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(|name| name.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    object_schema(&function.name, properties, required)
}

fn object_schema(name: &str, properties: Value, required: Vec<String>) -> Value {
    let mut all = Map::new();
    all.insert("_name".into(), json!({"const": name}));
    if let Value::Object(properties) = properties {
        all.extend(properties);
    }
    let mut required_all = vec!["_name".to_string()];
    required_all.extend(required);
    json!({"type": "object", "properties": all, "required": required_all, "additionalProperties": false})
}

/// The generated answer, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolAnswer {
    /// A call: the tool's name and its arguments as a JSON string.
    Call { name: String, arguments: String },
    /// `no_tool`: plain text.
    Text(String),
}

/// What every call's text starts with: the grammar writes compact JSON, `_name` first.
const CALL_PREFIX: &str = r#"{"function":{"_name":""#;

/// Parses a complete output of the tool grammar; `None` when it is not one (cut short by the
/// token limit).
pub fn parse_answer(generated: &str) -> Option<ToolAnswer> {
    let value: Value = serde_json::from_str(generated).ok()?;
    let call = value.get("function")?.as_object()?;
    let name = call.get("_name")?.as_str()?.to_string();
    if name == NO_TOOL {
        return Some(ToolAnswer::Text(call.get("content")?.as_str()?.to_string()));
    }
    // The arguments as generated (what a stream sent piece by piece), else re-serialized.
    let arguments = raw_arguments(generated, &name).unwrap_or_else(|| {
        let arguments: Map<String, Value> =
            call.iter().filter(|(key, _)| *key != "_name").map(|(k, v)| (k.clone(), v.clone())).collect();
        Value::Object(arguments).to_string()
    });
    Some(ToolAnswer::Call { name, arguments })
}

/// `{"function":{"_name":"n","a":1}}` -> `{"a":1}`; `{"function":{"_name":"n"}}` -> `{}`.
fn raw_arguments(generated: &str, name: &str) -> Option<String> {
    let rest = generated.strip_prefix(CALL_PREFIX)?.strip_prefix(name)?.strip_prefix('"')?;
    let inner = rest.strip_suffix("}}")?;
    match inner.strip_prefix(',') {
        Some(arguments) => Some(format!("{{{arguments}}}")),
        None if inner.is_empty() => Some("{}".into()),
        None => None,
    }
}

/// The part of a tool call a streamed chunk carries: the name in the call's first chunk, then
/// pieces of the arguments that add up to `ToolAnswer::Call::arguments`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallPiece {
    pub name: Option<String>,
    pub arguments: String,
}

impl CallPiece {
    /// One piece out of two that go in the same chunk.
    pub fn joined(first: Option<CallPiece>, second: Option<CallPiece>) -> Option<CallPiece> {
        match (first, second) {
            (Some(first), Some(second)) => Some(CallPiece {
                name: first.name.or(second.name),
                arguments: first.arguments + &second.arguments,
            }),
            (first, second) => first.or(second),
        }
    }
}

/// Follows a tool call's text as it is generated. The name is sent once it is complete; the
/// arguments as they grow, less their last character, which may be the brace that closes the
/// outer object and is not part of them.
#[derive(Debug, Default)]
pub struct CallStream {
    text: String,
    started: bool,
    arguments_sent: usize,
}

impl CallStream {
    /// Adds generated text; the piece of the call it completes, if any.
    pub fn push(&mut self, text: &str) -> Option<CallPiece> {
        self.text.push_str(text);
        let after_prefix = self.text.strip_prefix(CALL_PREFIX)?;
        let (name, rest) = after_prefix.split_once('"')?;
        // A name with escapes, or the plain answer, is left to the end of the generation.
        if name.contains('\\') || name == NO_TOOL || rest.is_empty() {
            return None;
        }
        let name = (!self.started).then(|| name.to_string());
        self.started = true;
        let growing = match rest.strip_prefix(',') {
            Some(arguments) => format!("{{{arguments}"),
            None => String::new(),
        };
        let ready = growing.char_indices().last().map_or(0, |(last, _)| last);
        let piece = growing.get(self.arguments_sent..ready).unwrap_or_default().to_string();
        self.arguments_sent = self.arguments_sent.max(ready);
        (name.is_some() || !piece.is_empty()).then_some(CallPiece { name, arguments: piece })
    }

    /// The rest of the call once the generation has ended with `answer`.
    pub fn finish(&mut self, answer: &ToolAnswer) -> Option<CallPiece> {
        let ToolAnswer::Call { name, arguments } = answer else { return None };
        let name = (!self.started).then(|| name.clone());
        self.started = true;
        let rest = arguments.get(self.arguments_sent..).unwrap_or_default().to_string();
        self.arguments_sent = arguments.len();
        Some(CallPiece { name, arguments: rest })
    }

    /// Whether the call's first piece was sent.
    pub fn started(&self) -> bool {
        self.started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"$ref": "#/$defs/unit"}}, "required": ["city"],
                "$defs": {"unit": {"enum": ["c", "f"]}}}}},
            {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])
    }

    fn schema(plan: &ToolPlan) -> &Value {
        let GrammarSpec::JsonSchema(schema) = &plan.grammar else { panic!("not a schema") };
        schema
    }

    #[test]
    fn auto_offers_every_tool_and_no_tool() {
        let plan = plan(Some(&weather()), None, None).unwrap().unwrap();
        let alternatives = schema(&plan)["properties"]["function"]["anyOf"].as_array().unwrap();
        let names: Vec<&Value> = alternatives.iter().map(|a| &a["properties"]["_name"]["const"]).collect();
        assert_eq!(names, [&json!("get_weather"), &json!("now"), &json!("no_tool")]);
        assert_eq!(alternatives[0]["required"], json!(["_name", "city"]));
        // `_name` comes first, so the name is generated before the arguments.
        assert_eq!(alternatives[0]["properties"].as_object().unwrap().keys().next().unwrap(), "_name");
        assert_eq!(schema(&plan)["$defs"]["unit"], json!({"enum": ["c", "f"]}));
        assert!(plan.prompt_suffix.starts_with(&format!("\n---\n{DEFAULT_TOOL_PROMPT}\n[")));
        assert!(plan.prompt_suffix.contains("get_weather"));
    }

    #[test]
    fn required_named_and_none_choices() {
        let required = plan(Some(&weather()), Some(&json!("required")), Some("Use a tool.")).unwrap().unwrap();
        assert_eq!(schema(&required)["properties"]["function"]["anyOf"].as_array().unwrap().len(), 2);
        assert!(required.prompt_suffix.starts_with("\n---\nUse a tool.\n"));
        let named = json!({"type": "function", "function": {"name": "now"}});
        let named = plan(Some(&weather()), Some(&named), None).unwrap().unwrap();
        let alternatives = schema(&named)["properties"]["function"]["anyOf"].as_array().unwrap().clone();
        assert_eq!(alternatives.len(), 1);
        assert_eq!(alternatives[0]["properties"]["_name"]["const"], "now");
        assert_eq!(plan(Some(&weather()), Some(&json!("none")), None), Ok(None));
        assert_eq!(plan(None, Some(&json!("required")), None), Ok(None));
    }

    #[test]
    fn bad_tools_and_choices_are_validation_errors() {
        let unknown = json!({"type": "function", "function": {"name": "fly"}});
        for (tools, choice) in [(weather(), unknown), (weather(), json!("sometimes")), (json!([{"function": {}}]), json!("auto"))] {
            assert!(matches!(plan(Some(&tools), Some(&choice), None), Err(ValidationError::InvalidTools(_))));
        }
    }

    #[test]
    fn a_streamed_call_adds_up_to_the_parsed_one() {
        for generated in [
            r#"{"function":{"_name":"get_weather","city":"Par\u00eds é","unit":"c"}}"#,
            r#"{"function":{"_name":"now"}}"#,
        ] {
            // Token by token: one character at a time, the worst case for the hold-back.
            let mut stream = CallStream::default();
            let mut name = None;
            let mut arguments = String::new();
            for piece in generated.chars().filter_map(|c| stream.push(&c.to_string())) {
                name = name.or(piece.name);
                arguments.push_str(&piece.arguments);
            }
            let answer = parse_answer(generated).unwrap();
            let last = stream.finish(&answer).unwrap();
            name = name.or(last.name);
            arguments.push_str(&last.arguments);
            let ToolAnswer::Call { name: parsed_name, arguments: parsed } = answer else { panic!("no call") };
            assert_eq!((name.unwrap(), arguments.as_str()), (parsed_name, parsed.as_str()));
            serde_json::from_str::<Value>(&arguments).unwrap();
        }
        let mut plain = CallStream::default();
        assert_eq!(plain.push(r#"{"function":{"_name":"no_tool","content":"hi"#), None);
        assert!(!plain.started());
    }

    #[test]
    fn answers_parse_into_calls_or_text() {
        assert_eq!(
            parse_answer(r#"{"function":{"_name":"get_weather","city":"Paris","unit":"c"}}"#),
            Some(ToolAnswer::Call { name: "get_weather".into(), arguments: r#"{"city":"Paris","unit":"c"}"#.into() })
        );
        assert_eq!(
            parse_answer(r#"{"function":{"_name":"no_tool","content":"Hello"}}"#),
            Some(ToolAnswer::Text("Hello".into()))
        );
        assert_eq!(parse_answer(r#"{"function":{"_name":"get_wea"#), None);
    }
}
