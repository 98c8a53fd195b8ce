//! OpenAI tool calls on `/v1/chat/completions`, generated under a grammar as TGI does: the
//! request's `tools` and `tool_choice` become one JSON schema, `{"function": {"_name": <a
//! tool's name>, <its arguments>}}` (with `auto`, also the `no_tool` answer `{"_name":
//! "no_tool", "content": <text>}`; with `required` and `parallel_tool_calls: true`, a list of
//! one or more calls, `{"function": [<call>, …]}`); the conversation's last message gets TGI's tool prompt
//! and the tools; the output is parsed back into OpenAI's `tool_calls` (arguments as a JSON
//! string).
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::openai_stream::PerChoice;
use super::tool_parser::{CallDelta, ParsedCall, ToolCallParser, ToolCallSplitter};
use crate::grammar::GrammarSpec;
use crate::validation::ValidationError;

/// How a chat reply's tool calls are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolReading {
    /// No tool is offered (none given, or `tool_choice: "none"`).
    None,
    /// Generated under TGI's grammar: one call (or, with `auto`, TGI's `no_tool` answer); with
    /// `required` and `parallel_tool_calls: true`, one or more (`plan`).
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
/// or `tool_choice: "none"`). With `required` and `list` (the request's `parallel_tool_calls:
/// true`) the answer is a list of one or more calls, `{"function": [<call>, …]}`; otherwise one
/// call (TGI's answer).
pub fn plan(tools: Option<&Value>, tool_choice: Option<&Value>, tool_prompt: Option<&str>, list: bool) -> Result<Option<ToolPlan>, ValidationError> {
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
    let answer = match choice {
        ToolChoice::Required if list => json!({"type": "array", "minItems": 1, "items": {"anyOf": alternatives}}),
        _ => json!({"anyOf": alternatives}),
    };
    let mut schema = json!({"type": "object", "properties": {"function": answer},
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
    /// Calls (one, or with `required` and parallel calls, one or more): each tool's name and
    /// its arguments as a JSON string, in the order generated.
    Calls(Vec<ParsedCall>),
    /// `no_tool`: plain text.
    Text(String),
}

/// What every answer's text starts with; then `{` (one call) or `[` (a list of calls). The
/// grammar writes compact JSON, `_name` first in each call.
const ANSWER_PREFIX: &str = r#"{"function":"#;
/// What every call's text starts with.
const CALL_PREFIX: &str = r#"{"_name":""#;

/// Parses a complete output of the tool grammar; `None` when it is not one (cut short by the
/// token limit: `complete_calls` reads the calls it finished).
pub fn parse_answer(generated: &str) -> Option<ToolAnswer> {
    let value: Value = serde_json::from_str(generated).ok()?;
    let calls = match value.get("function")? {
        Value::Object(call) => {
            if call.get("_name")?.as_str()? == NO_TOOL {
                return Some(ToolAnswer::Text(call.get("content")?.as_str()?.to_string()));
            }
            vec![call]
        }
        Value::Array(calls) => calls.iter().map(Value::as_object).collect::<Option<Vec<_>>>()?,
        _ => return None,
    };
    let raw = scan(generated);
    let parsed = calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let name = call.get("_name")?.as_str()?.to_string();
            // The arguments as generated (what a stream sent piece by piece), else re-serialized.
            let arguments = match raw.get(index) {
                Some(span) if span.closed && span.name == name => span.arguments.clone(),
                _ => {
                    let arguments: Map<String, Value> =
                        call.iter().filter(|(key, _)| *key != "_name").map(|(k, v)| (k.clone(), v.clone())).collect();
                    Value::Object(arguments).to_string()
                }
            };
            Some(ParsedCall { name, arguments })
        })
        .collect::<Option<Vec<_>>>()?;
    (!parsed.is_empty()).then_some(ToolAnswer::Calls(parsed))
}

/// The calls a reply cut short had finished (its last, unfinished one left out).
pub fn complete_calls(generated: &str) -> Vec<ParsedCall> {
    scan(generated)
        .into_iter()
        .take_while(|span| span.closed)
        .filter(|span| span.name != NO_TOOL)
        .map(|span| ParsedCall { name: span.name, arguments: span.arguments })
        .collect()
}

/// One call in the text so far: its name (complete), its arguments so far (all of them, braces
/// included, once `closed`).
#[derive(Debug, Clone, PartialEq)]
struct CallSpan {
    name: String,
    arguments: String,
    closed: bool,
}

/// The calls of a (partial) answer, read by structure: a call ends at the brace that closes its
/// object, outside strings, so a streamed call's arguments are sent as they grow, and none is
/// cut at a brace inside a string. A name with escapes stops the reading there (its call is left
/// to the end of the generation).
fn scan(text: &str) -> Vec<CallSpan> {
    let mut scanned = Vec::new();
    let Some(rest) = text.strip_prefix(ANSWER_PREFIX) else { return scanned };
    let (list, mut rest) = match rest.as_bytes().first() {
        Some(b'[') => (true, &rest[1..]),
        Some(b'{') => (false, rest),
        _ => return scanned,
    };
    loop {
        let Some(after) = rest.strip_prefix(CALL_PREFIX) else { return scanned };
        let Some((name, after_name)) = after.split_once('"') else { return scanned };
        if name.contains('\\') {
            return scanned;
        }
        let (arguments, closed, next) = match after_name.as_bytes().first() {
            None => (String::new(), false, ""),
            Some(b'}') => ("{}".to_string(), true, &after_name[1..]),
            Some(b',') => {
                let body = &after_name[1..];
                match object_end(body) {
                    Some(end) => (format!("{{{}}}", &body[..end]), true, &body[end + 1..]),
                    None => (format!("{{{body}"), false, ""),
                }
            }
            Some(_) => return scanned,
        };
        scanned.push(CallSpan { name: name.to_string(), arguments, closed });
        if !closed || !list {
            return scanned;
        }
        match next.strip_prefix(',') {
            Some(more) => rest = more,
            None => return scanned,
        }
    }
}

/// Where the object whose body `body` is (its opening brace already read) closes: the byte
/// index of that `}`, outside strings; `None` while it is still open.
fn object_end(body: &str) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, byte) in body.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if in_string => escaped = true,
            b'"' => in_string = !in_string,
            _ if in_string => {}
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => depth -= 1,
            b'}' => return Some(at),
            _ => {}
        }
    }
    None
}

/// Follows an answer's calls as they are generated: each call is named once its name is
/// complete, and its arguments are sent as they grow.
#[derive(Debug, Default)]
pub struct CallStream {
    text: String,
    /// Per call begun: the bytes of its arguments sent.
    sent: Vec<usize>,
}

impl CallStream {
    /// Adds generated text; the pieces of calls it adds.
    pub fn push(&mut self, text: &str) -> Vec<CallDelta> {
        self.text.push_str(text);
        let spans = scan(&self.text);
        self.pieces(spans.iter().filter(|span| span.name != NO_TOOL).map(|span| (span.name.as_str(), span.arguments.as_str())))
    }

    /// The rest of the calls once the generation has ended with `answer`.
    pub fn finish(&mut self, answer: &ToolAnswer) -> Vec<CallDelta> {
        let ToolAnswer::Calls(calls) = answer else { return Vec::new() };
        self.pieces(calls.iter().map(|call| (call.name.as_str(), call.arguments.as_str())))
    }

    /// What `calls` (name, arguments so far) add to what was sent.
    fn pieces<'a>(&mut self, calls: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<CallDelta> {
        let mut pieces = Vec::new();
        for (index, (name, arguments)) in calls.enumerate() {
            let name = (index >= self.sent.len()).then(|| name.to_string());
            if name.is_some() {
                self.sent.push(0);
            }
            let sent = &mut self.sent[index];
            let piece = arguments.get(*sent..).unwrap_or_default().to_string();
            *sent = (*sent).max(arguments.len());
            if name.is_some() || !piece.is_empty() {
                pieces.push(CallDelta { index: index as u32, name, arguments: piece });
            }
        }
        pieces
    }

    /// Whether a call's first piece was sent.
    pub fn started(&self) -> bool {
        !self.sent.is_empty()
    }
}

/// Two lists of pieces that go in one chunk, as one: a call's pieces are joined.
pub fn joined(first: Vec<CallDelta>, second: Vec<CallDelta>) -> Vec<CallDelta> {
    let mut all: Vec<CallDelta> = Vec::with_capacity(first.len() + second.len());
    for piece in first.into_iter().chain(second) {
        match all.iter_mut().find(|joined| joined.index == piece.index) {
            Some(joined) => {
                joined.name = joined.name.take().or(piece.name);
                joined.arguments.push_str(&piece.arguments);
            }
            None => all.push(piece),
        }
    }
    all
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
        let plan = plan(Some(&weather()), None, None, true).unwrap().unwrap();
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
        let required = plan(Some(&weather()), Some(&json!("required")), Some("Use a tool."), false).unwrap().unwrap();
        assert_eq!(schema(&required)["properties"]["function"]["anyOf"].as_array().unwrap().len(), 2);
        assert!(required.prompt_suffix.starts_with("\n---\nUse a tool.\n"));
        let named = json!({"type": "function", "function": {"name": "now"}});
        let named = plan(Some(&weather()), Some(&named), None, true).unwrap().unwrap();
        let alternatives = schema(&named)["properties"]["function"]["anyOf"].as_array().unwrap().clone();
        assert_eq!(alternatives.len(), 1);
        assert_eq!(alternatives[0]["properties"]["_name"]["const"], "now");
        assert_eq!(plan(Some(&weather()), Some(&json!("none")), None, true), Ok(None));
        assert_eq!(plan(None, Some(&json!("required")), None, true), Ok(None));
    }

    #[test]
    fn bad_tools_and_choices_are_validation_errors() {
        let unknown = json!({"type": "function", "function": {"name": "fly"}});
        for (tools, choice) in [(weather(), unknown), (weather(), json!("sometimes")), (json!([{"function": {}}]), json!("auto"))] {
            assert!(matches!(plan(Some(&tools), Some(&choice), None, true), Err(ValidationError::InvalidTools(_))));
        }
    }

    #[test]
    fn required_with_parallel_calls_asks_for_a_list_of_calls() {
        let required = plan(Some(&weather()), Some(&json!("required")), None, true).unwrap().unwrap();
        let answer = &schema(&required)["properties"]["function"];
        assert_eq!((&answer["type"], &answer["minItems"]), (&json!("array"), &json!(1)));
        let names: Vec<&Value> =
            answer["items"]["anyOf"].as_array().unwrap().iter().map(|a| &a["properties"]["_name"]["const"]).collect();
        assert_eq!(names, [&json!("get_weather"), &json!("now")]);
        // A named function and `auto` stay one answer, as TGI's.
        let named = json!({"type": "function", "function": {"name": "now"}});
        for choice in [named, json!("auto")] {
            let one = plan(Some(&weather()), Some(&choice), None, true).unwrap().unwrap();
            assert!(schema(&one)["properties"]["function"]["anyOf"].is_array());
        }
    }

    /// Every call's pieces, streamed `step` characters at a time, then the end's.
    fn streamed(generated: &str, step: usize) -> Vec<(String, String)> {
        let mut stream = CallStream::default();
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut add = |pieces: Vec<CallDelta>| {
            for CallDelta { index, name, arguments } in pieces {
                let index = index as usize;
                match name {
                    Some(name) => {
                        assert_eq!(index, calls.len(), "a call is named once, in order");
                        calls.push((name, arguments));
                    }
                    None => calls[index].1.push_str(&arguments),
                }
            }
        };
        let chars: Vec<char> = generated.chars().collect();
        for piece in chars.chunks(step) {
            add(stream.push(&piece.iter().collect::<String>()));
        }
        if let Some(answer) = parse_answer(generated) {
            add(stream.finish(&answer));
        }
        calls
    }

    #[test]
    fn streamed_calls_add_up_to_the_parsed_ones() {
        for generated in [
            r#"{"function":{"_name":"get_weather","city":"Par\u00eds é","unit":"c"}}"#,
            r#"{"function":{"_name":"now"}}"#,
            r#"{"function":{"_name":"get_weather","city":"a}\"{b","nested":{"x":[1,{"y":"}"}]}}}"#,
            r#"{"function":[{"_name":"get_weather","city":"Paris"},{"_name":"now"},{"_name":"get_weather","city":"R}ome"}]}"#,
        ] {
            let Some(ToolAnswer::Calls(parsed)) = parse_answer(generated) else { panic!("no calls in {generated}") };
            let parsed: Vec<(String, String)> = parsed.into_iter().map(|call| (call.name, call.arguments)).collect();
            for step in [1, 2, 3, 7, generated.len()] {
                assert_eq!(streamed(generated, step), parsed, "{generated} by {step}");
            }
            for (_, arguments) in &parsed {
                serde_json::from_str::<Value>(arguments).unwrap();
            }
        }
        let mut plain = CallStream::default();
        assert!(plain.push(r#"{"function":{"_name":"no_tool","content":"hi"#).is_empty());
        assert!(!plain.started());
    }

    #[test]
    fn a_list_cut_short_keeps_the_calls_it_finished() {
        let cut = r#"{"function":[{"_name":"get_weather","city":"Paris"},{"_name":"get_weather","ci"#;
        assert_eq!(parse_answer(cut), None);
        assert_eq!(complete_calls(cut), [ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
        // Streamed, the unfinished call is named and its arguments begun.
        let calls = streamed(cut, 4);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1], ("get_weather".to_string(), r#"{"ci"#.to_string()));
        assert!(complete_calls(r#"{"function":{"_name":"get_wea"#).is_empty());
    }

    #[test]
    fn answers_parse_into_calls_or_text() {
        assert_eq!(
            parse_answer(r#"{"function":{"_name":"get_weather","city":"Paris","unit":"c"}}"#),
            Some(ToolAnswer::Calls(vec![ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"Paris","unit":"c"}"#.into() }]))
        );
        assert_eq!(
            parse_answer(r#"{"function":{"_name":"no_tool","content":"Hello"}}"#),
            Some(ToolAnswer::Text("Hello".into()))
        );
        assert_eq!(parse_answer(r#"{"function":{"_name":"get_wea"#), None);
        let list = r#"{"function":[{"_name":"now"},{"_name":"get_weather","city":"Rome"}]}"#;
        assert_eq!(
            parse_answer(list),
            Some(ToolAnswer::Calls(vec![
                ParsedCall { name: "now".into(), arguments: "{}".into() },
                ParsedCall { name: "get_weather".into(), arguments: r#"{"city":"Rome"}"#.into() },
            ]))
        );
        assert_eq!(parse_answer(r#"{"function":[]}"#), None);
    }
}
