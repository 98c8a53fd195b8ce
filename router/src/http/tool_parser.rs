//! Tool calls in the model's own format (`--tool-call-parser`, vLLM's flag): with
//! `tool_choice: "auto"` the reply is generated freely, as the model was trained to call tools,
//! and the calls are read out of it — any number of them (`parallel_tool_calls`). Without the
//! flag, or with `required` or a named function, the calls are generated under TGI's grammar
//! (`tools`): one per reply, or one or more with `required` and `parallel_tool_calls: true`.
//!
//! `hermes` (Qwen 2.5 and 3, Hermes, and the many models trained on its format): each call is
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; the text around the calls is the
//! message's content. Streamed, content goes out as it comes (a piece that may start a tag waits
//! for the next); a call is named once its arguments begin and its arguments go out as they
//! grow (`stream_arguments`), so a long call does not stall the stream until it closes.
//!
//! `llama3_json` (Llama 3.1, 3.2 and 3.3): a reply that is calls is JSON from its start —
//! `{"name": …, "parameters": {…}}`, several separated by `;` (after `<|python_tag|>`, where the
//! text keeps it) — and any other reply is content. Each object of a reply that opens with `{`
//! is a call once it reads as one; streamed, it is named once its parameters begin and they go
//! out as they grow, as `hermes`'s arguments do. The first object that is not a call (whole, or
//! where its JSON breaks), and all that follows it, is content.
//!
//! `mistral` (Mistral 7B v0.3, Mixtral, Nemo, Small, and the later ones): content, then the
//! `[TOOL_CALLS]` token and the calls — a JSON array of `{"name": …, "arguments": {…}}`
//! (tokenizers before v11), or `name[ARGS]{…}` per call, each after its own `[TOOL_CALLS]`
//! (v11 on; a `[CALL_ID]…` after the name is read past). The token is special, so the reply's
//! text keeps special tokens under this parser (vLLM does the same); each call's id is 9
//! letters and digits, the only form Mistral's chat templates take back. Streamed, a call is
//! named once its arguments begin and they go out as they grow. What follows the marker and is
//! not calls is content; a call begun whose JSON breaks stays as sent, and the rest is dropped.
//!
//! One splitter serves the whole reply and the stream, so both give the same calls and content.
use serde_json::Value;

use super::reasoning::partial_tag;
use crate::tokenizer::Tokenizer;

/// The model's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call.
    Hermes,
    /// A reply that is JSON calls, `{"name": …, "parameters": {…}}`, `;` between them.
    #[value(name = "llama3_json", alias = "llama3-json")]
    Llama3Json,
    /// `[TOOL_CALLS]` and a JSON array of calls, or `[TOOL_CALLS]name[ARGS]{…}` per call.
    Mistral,
}

impl ToolCallParser {
    /// The format's tags that are special tokens in this tokenizer (Mistral's `[TOOL_CALLS]`
    /// from tokenizer v3 on, `<tool_call>` in some Hermes models'): the reply's text must keep
    /// them, or the calls would read as content. `llama3_json` reads its calls with or without
    /// `<|python_tag|>`.
    pub fn special_tags(self, tokenizer: &Tokenizer) -> Vec<u32> {
        let tags: &[&str] = match self {
            ToolCallParser::Hermes => &[START, END],
            ToolCallParser::Llama3Json => &[],
            ToolCallParser::Mistral => &[TOOL_CALLS, ARGS, CALL_ID],
        };
        tokenizer.special_ids_of(tags)
    }

    /// A new id for a call read in this format: unique, as a conversation sends each call's
    /// result back under its id; for `mistral`, 9 letters and digits, which Mistral's chat
    /// templates require of the ids they are sent back.
    pub fn call_id(self) -> String {
        match self {
            ToolCallParser::Mistral => {
                const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
                (0..9).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect()
            }
            ToolCallParser::Hermes | ToolCallParser::Llama3Json => format!("chatcmpl-tool-{:016x}", rand::random::<u64>()),
        }
    }
}

/// Llama 3's marker before a call, where the reply's text keeps special tokens.
const PYTHON_TAG: &str = "<|python_tag|>";

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// Mistral's marker before its calls, and, from tokenizer v11, before a call's arguments and
/// its id.
const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// Where a `mistral` reading is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MistralAt {
    /// Content, until the marker.
    Text,
    /// Just past the marker: what follows decides the form.
    Marker,
    /// In a JSON array of calls (or at a lone call object), read object by object (`json`).
    Array,
    /// A v11 call's name, until `[ARGS]`.
    Name,
    /// A v11 call's arguments object, named.
    Arguments(String),
    /// What followed the marker was not calls: the rest of the reply is content.
    Plain,
}

/// One call read out of the reply: the tool's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// A whole reply, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole {
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
    /// Its calls were closed (none cut short by the reply's end).
    pub called: bool,
}

/// A piece of a call: its first names it; the pieces' `arguments` add up to the call's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    /// The call's place among the reply's calls.
    pub index: u32,
    pub name: Option<String>,
    pub arguments: String,
}

/// What one piece of the reply adds: content, and pieces of calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<CallDelta>,
}

impl Parsed {
    /// The pieces' calls, whole, in order.
    pub fn joined_calls(deltas: impl IntoIterator<Item = CallDelta>) -> Vec<ParsedCall> {
        let mut calls: Vec<ParsedCall> = Vec::new();
        for delta in deltas {
            match (delta.name, calls.get_mut(delta.index as usize)) {
                (_, Some(call)) => call.arguments.push_str(&delta.arguments),
                (name, None) => calls.push(ParsedCall { name: name.unwrap_or_default(), arguments: delta.arguments }),
            }
        }
        calls
    }
}

/// The state of one reply's reading.
#[derive(Debug, Clone)]
pub struct ToolCallSplitter {
    parser: ToolCallParser,
    /// `llama3_json`: the reply's start is not yet read (white space, or part of the tag).
    opening: bool,
    /// `llama3_json`: the reply opened as JSON and is read as calls, object by object.
    json: bool,
    /// Calls given out at most (`parallel_tool_calls: false`: one); blocks past it are read and
    /// dropped.
    limit: u32,
    /// Inside a call's block.
    in_call: bool,
    /// Text not yet given out: a call's body, or a possible tag's start.
    pending: String,
    /// White space at the end of the content so far, given out only when more content follows
    /// it: the line breaks around and between calls are not the message's content.
    space: String,
    /// Calls begun so far (the next one's index).
    calls: u32,
    /// The block (`hermes`) or object (`llama3_json`) being read has had its call begun (named)
    /// in the stream, and this many bytes of its arguments given out.
    open_call: Option<usize>,
    /// A call begun in the stream was cut short by the reply's end (or broke, `broken`).
    cut: bool,
    /// `llama3_json` and `mistral`: a call begun in the stream broke (its JSON did); the rest
    /// is dropped.
    broken: bool,
    /// `mistral`: where the reading is.
    mistral: MistralAt,
}

impl ToolCallSplitter {
    /// A reading in `parser`'s format that gives out at most `limit` calls.
    pub fn new(parser: ToolCallParser, limit: u32) -> Self {
        Self {
            parser,
            opening: true,
            json: false,
            limit,
            in_call: false,
            pending: String::new(),
            space: String::new(),
            calls: 0,
            open_call: None,
            cut: false,
            broken: false,
            mistral: MistralAt::Text,
        }
    }

    /// The format it reads.
    pub fn parser(&self) -> ToolCallParser {
        self.parser
    }

    /// Reads the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Parsed {
        self.pending.push_str(text);
        match self.parser {
            ToolCallParser::Llama3Json => return self.push_json(),
            ToolCallParser::Mistral => return self.push_mistral(),
            ToolCallParser::Hermes => {}
        }
        let mut parsed = Parsed::default();
        loop {
            if self.in_call {
                let Some(at) = self.pending.find(END) else {
                    self.stream_arguments(&mut parsed);
                    return parsed;
                };
                let body: String = self.pending.drain(..at + END.len()).take(at).collect();
                self.in_call = false;
                match (self.open_call.take(), read_call(&body)) {
                    // Begun in the stream: the rest of its arguments.
                    (Some(sent), Some(call)) => {
                        let rest = call.arguments.get(sent..).unwrap_or_default().to_string();
                        parsed.calls.push(CallDelta { index: self.calls - 1, name: None, arguments: rest });
                    }
                    // Begun, but not a call after all: it stays as it was sent.
                    (Some(_), None) => {}
                    (None, Some(call)) => self.give(call, &mut parsed),
                    // Not a call after all: the block is the message's text, as written.
                    (None, None) => self.content(&format!("{START}{body}{END}"), &mut parsed),
                }
            } else {
                match self.pending.find(START) {
                    Some(at) => {
                        let before: String = self.pending.drain(..at + START.len()).take(at).collect();
                        self.content(&before, &mut parsed);
                        self.in_call = true;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, START);
                        let released: String = self.pending.drain(..self.pending.len() - keep).collect();
                        self.content(&released, &mut parsed);
                        return parsed;
                    }
                }
            }
        }
    }

    /// Releases what was held back at the end of the reply: a possible tag's start, or a block
    /// the reply did not close (cut by its token limit), as text. White space at the end is
    /// not content.
    pub fn finish(&mut self) -> Parsed {
        let rest = std::mem::take(&mut self.pending);
        let mut parsed = Parsed::default();
        if self.parser == ToolCallParser::Mistral && !self.json {
            // A call begun and cut short stays as it was sent; a name without its arguments,
            // or a possible marker's start, is content.
            if self.open_call.take().is_some() {
                self.cut = true;
            } else if !self.broken && self.mistral != MistralAt::Marker {
                self.content(&rest, &mut parsed);
            }
            self.space.clear();
            return parsed;
        }
        if self.json {
            self.json = false;
            // An object the reply did not finish: a call begun stays as it was sent.
            if self.open_call.take().is_some() {
                self.cut = true;
            } else {
                self.content(&rest, &mut parsed);
            }
            self.space.clear();
            return parsed;
        }
        let rest = match (self.in_call, self.open_call.take()) {
            // A call begun and cut short stays as it was sent.
            (true, Some(_)) => {
                self.cut = true;
                String::new()
            }
            (true, None) => format!("{START}{rest}"),
            (false, _) => rest,
        };
        self.in_call = false;
        self.content(&rest, &mut parsed);
        self.space.clear();
        parsed
    }

    /// Whether the reply called: it closed a call, and none is left cut short.
    pub fn called(&self) -> bool {
        self.calls > 0 && self.open_call.is_none() && !self.cut
    }

    /// `llama3_json`: the reply's start decides whether it is calls (read object by object)
    /// or content (given out as it comes).
    fn push_json(&mut self) -> Parsed {
        let mut parsed = Parsed::default();
        if self.broken {
            self.pending.clear();
            return parsed;
        }
        if self.opening {
            let head = self.pending.trim_start();
            let after_tag = head.strip_prefix(PYTHON_TAG).map(str::trim_start);
            if head.is_empty() || (after_tag.is_none() && PYTHON_TAG.starts_with(head)) || after_tag == Some("") {
                return parsed;
            }
            self.opening = false;
            let body = after_tag.unwrap_or(head);
            if body.starts_with('{') {
                // The calls from their first brace (the tag and white space before are no content).
                self.pending = body.to_string();
                self.json = true;
            }
        }
        if self.json {
            self.read_json_objects(&mut parsed);
            if self.json {
                return parsed;
            }
        }
        let text = std::mem::take(&mut self.pending);
        self.content(&text, &mut parsed);
        parsed
    }

    /// `llama3_json`, in a reply of calls: gives out each object that is a call once it is
    /// whole (the rest of its parameters, when it was begun), begins the one being written and
    /// streams its parameters; at the first object that is not a call, the reply turns to
    /// content from there (`json` false, that object left in `pending`).
    fn read_json_objects(&mut self, parsed: &mut Parsed) {
        loop {
            if self.open_call.is_none() {
                let between = if self.parser == ToolCallParser::Mistral { ',' } else { ';' };
                let separators = self.pending.len() - self.pending.trim_start_matches(|c: char| c.is_whitespace() || c == between).len();
                self.pending.drain(..separators);
            }
            if self.pending.is_empty() {
                return;
            }
            if !self.pending.starts_with('{') {
                self.json = false;
                return;
            }
            let mut values = serde_json::Deserializer::from_str(&self.pending).into_iter::<Value>();
            match values.next() {
                Some(Ok(value)) => {
                    let end = values.byte_offset();
                    let object: String = self.pending.drain(..end).collect();
                    match (self.open_call.take(), call_of(&value)) {
                        (Some(sent), Some(call)) => {
                            let arguments = written_arguments(&object, &value).unwrap_or(call.arguments);
                            let rest = arguments.get(sent..).unwrap_or_default().to_string();
                            parsed.calls.push(CallDelta { index: self.calls - 1, name: None, arguments: rest });
                        }
                        // Begun, but not a call after all: it stays as it was sent.
                        (Some(_), None) => {}
                        (None, Some(mut call)) => {
                            if let Some(arguments) = written_arguments(&object, &value) {
                                call.arguments = arguments;
                            }
                            self.give(call, parsed);
                        }
                        (None, None) => {
                            self.pending.insert_str(0, &object);
                            self.json = false;
                            return;
                        }
                    }
                }
                // Not finished yet: its parameters go out as they grow.
                Some(Err(error)) if error.is_eof() => {
                    self.stream_arguments(parsed);
                    return;
                }
                // Not JSON. The text up to the break reads as a stream of it does (however the
                // reply was cut into pieces): a call begun there, its arguments sent up to the
                // break, stays as it was sent, and the rest of the reply is dropped; otherwise
                // the reply is content from this object on.
                Some(Err(error)) => {
                    let whole = std::mem::take(&mut self.pending);
                    self.pending = whole[..error_offset(&whole, &error)].to_string();
                    self.stream_arguments(parsed);
                    if self.open_call.take().is_some() {
                        self.cut = true;
                        self.broken = true;
                        self.pending.clear();
                    } else {
                        self.pending = whole;
                        self.json = false;
                    }
                    return;
                }
                None => return,
            }
        }
    }

    /// `mistral`: content until the marker, then the calls in either form (`MistralAt`).
    fn push_mistral(&mut self) -> Parsed {
        let mut parsed = Parsed::default();
        loop {
            if self.broken {
                self.pending.clear();
                return parsed;
            }
            match std::mem::replace(&mut self.mistral, MistralAt::Plain) {
                MistralAt::Text => match self.pending.find(TOOL_CALLS) {
                    Some(at) => {
                        let before: String = self.pending.drain(..at + TOOL_CALLS.len()).take(at).collect();
                        self.content(&before, &mut parsed);
                        self.mistral = MistralAt::Marker;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, TOOL_CALLS);
                        let released: String = self.pending.drain(..self.pending.len() - keep).collect();
                        self.content(&released, &mut parsed);
                        self.mistral = MistralAt::Text;
                        return parsed;
                    }
                },
                MistralAt::Marker => {
                    let skip = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..skip);
                    self.mistral = match self.pending.chars().next() {
                        None => {
                            self.mistral = MistralAt::Marker;
                            return parsed;
                        }
                        Some('[') => {
                            self.pending.drain(..1);
                            MistralAt::Array
                        }
                        Some('{') => MistralAt::Array,
                        Some(_) => MistralAt::Name,
                    };
                }
                MistralAt::Array => {
                    self.json = true;
                    self.read_json_objects(&mut parsed);
                    if self.json {
                        self.mistral = MistralAt::Array;
                        return parsed;
                    }
                    // The array's end (more calls may follow their own marker), or what is not a
                    // call: content from there on.
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(']') {
                        self.pending = after.to_string();
                        self.mistral = MistralAt::Text;
                    }
                }
                MistralAt::Name => match self.pending.find(ARGS) {
                    Some(at) => {
                        let head: String = self.pending.drain(..at + ARGS.len()).take(at).collect();
                        let name = head.split(CALL_ID).next().unwrap_or_default().trim().to_string();
                        self.mistral = if name.is_empty() { MistralAt::Plain } else { MistralAt::Arguments(name) };
                    }
                    // A name has no white space: a reply that has some before any `[ARGS]` is
                    // not a call.
                    None if self.pending.contains(char::is_whitespace) => {}
                    None => {
                        self.mistral = MistralAt::Name;
                        return parsed;
                    }
                },
                MistralAt::Arguments(name) => {
                    let start = self.pending.len() - self.pending.trim_start().len();
                    let body = &self.pending[start..];
                    if body.is_empty() {
                        self.mistral = MistralAt::Arguments(name);
                        return parsed;
                    }
                    let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
                    match values.next() {
                        Some(Ok(Value::Object(_))) => {
                            let end = start + values.byte_offset();
                            let arguments = self.pending[start..end].to_string();
                            self.pending.drain(..end);
                            match self.open_call.take() {
                                Some(sent) => {
                                    let rest = arguments.get(sent..).unwrap_or_default().to_string();
                                    parsed.calls.push(CallDelta { index: self.calls - 1, name: None, arguments: rest });
                                }
                                None => self.give(ParsedCall { name, arguments }, &mut parsed),
                            }
                            self.mistral = MistralAt::Text;
                        }
                        // Not finished yet: its arguments go out as they grow.
                        Some(Err(error)) if error.is_eof() && body.starts_with('{') => {
                            self.stream_from(name.clone(), start, &mut parsed);
                            self.mistral = MistralAt::Arguments(name);
                            return parsed;
                        }
                        // The arguments' JSON breaks. The text up to the break reads as a
                        // stream of it does: the call begun there, its arguments sent up to
                        // the break, stays as sent, and the rest of the reply is dropped.
                        Some(Err(error)) if body.starts_with('{') => {
                            let whole = std::mem::take(&mut self.pending);
                            self.pending = whole[..start + error_offset(&whole[start..], &error)].to_string();
                            self.stream_from(name, start, &mut parsed);
                            if self.open_call.take().is_some() {
                                self.cut = true;
                                self.broken = true;
                            } else {
                                self.pending = whole;
                            }
                        }
                        // Not an object: the rest is content.
                        _ => {}
                    }
                }
                MistralAt::Plain => {
                    let text = std::mem::take(&mut self.pending);
                    self.content(&text, &mut parsed);
                    return parsed;
                }
            }
        }
    }

    /// Gives out a whole call, within the limit.
    fn give(&mut self, call: ParsedCall, parsed: &mut Parsed) {
        self.space.clear();
        if self.calls < self.limit {
            parsed.calls.push(CallDelta { index: self.calls, name: Some(call.name), arguments: call.arguments });
            self.calls += 1;
        }
    }

    /// Inside a call not yet closed: once its name and the start of its arguments object are
    /// read (`{"name": "…", "arguments": {`, as Hermes-trained models write them; `parameters`
    /// with Llama's), the call begins and its arguments go out as they grow — less a tail that
    /// may close the call's object (white space, `}`) or begin `hermes`'s closing tag.
    fn stream_arguments(&mut self, parsed: &mut Parsed) {
        let Some((name, start)) = arguments_start(&self.pending) else { return };
        self.stream_from(name, start, parsed);
    }

    /// Begins the call `name` (unless begun) and gives out its arguments, which start at byte
    /// `start` of `pending`, as far as they are written — less a tail that may close them.
    fn stream_from(&mut self, name: String, start: usize, parsed: &mut Parsed) {
        let sent = match self.open_call {
            Some(sent) => sent,
            None if self.calls < self.limit => {
                self.space.clear();
                parsed.calls.push(CallDelta { index: self.calls, name: Some(name), arguments: String::new() });
                self.calls += 1;
                0
            }
            // Past the limit: read, not given out.
            None => return,
        };
        let growing = &self.pending[start..];
        let tag = if self.parser == ToolCallParser::Hermes { partial_tag(growing, END) } else { 0 };
        let growing = &growing[..growing.len() - tag];
        let ready = growing.trim_end_matches(|c: char| c.is_whitespace() || c == '}').len();
        if ready > sent {
            parsed.calls.push(CallDelta { index: self.calls - 1, name: None, arguments: growing[sent..ready].to_string() });
        }
        self.open_call = Some(sent.max(ready));
    }

    /// A whole reply: its content (none when it is only white space), its calls, and whether
    /// it called (`called`), read as a stream of it is.
    pub fn split_whole(mut self, text: &str) -> Whole {
        let (first, last) = (self.push(text), self.finish());
        let content = first.content + &last.content;
        let calls = Parsed::joined_calls(first.calls.into_iter().chain(last.calls));
        Whole { content: (!content.is_empty()).then_some(content), calls, called: self.called() }
    }

    /// Gives out content; the white space it ends with waits for more.
    fn content(&mut self, text: &str, parsed: &mut Parsed) {
        let (words, space) = text.split_at(text.trim_end().len());
        if !words.is_empty() {
            parsed.content.push_str(&std::mem::take(&mut self.space));
            parsed.content.push_str(words);
        }
        self.space.push_str(space);
    }
}

/// The byte of `text` where reading it as JSON found `error`: serde_json counts lines, and
/// the bytes of the line, from 1.
fn error_offset(text: &str, error: &serde_json::Error) -> usize {
    let line_start: usize = text.split_inclusive('\n').take(error.line().saturating_sub(1)).map(str::len).sum();
    let mut at = (line_start + error.column().saturating_sub(1)).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `{"name": "f", "arguments": {…}}` (or `parameters`, or the arguments as a JSON string) -> a
/// call; `None` when the block is not one. Its arguments as written where the stream gives them
/// out as they grow (`arguments_start`), else as JSON.
fn read_call(body: &str) -> Option<ParsedCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let mut call = call_of(&value)?;
    if let Some(arguments) = written_arguments(body, &value) {
        call.arguments = arguments;
    }
    Some(call)
}

/// A call object's arguments as its text writes them, where the stream gives them out as they
/// grow (`arguments_start`); `None` otherwise. `text` is the whole object, `value` its JSON.
fn written_arguments(text: &str, value: &Value) -> Option<String> {
    let (_, start) = arguments_start(text)?;
    // The object parsed, so its text ends with its closing brace.
    let written = text[start..text.trim_end().len() - 1].trim_end();
    let arguments = value.get("arguments").or_else(|| value.get("parameters"));
    (serde_json::from_str::<Value>(written).ok().as_ref() == arguments).then(|| written.to_string())
}

/// Where a call's arguments object starts in its block's text, and the call's name, when the
/// block opens as `{"name": "…", "arguments": {` (or `"parameters"`; white space anywhere
/// between); `None` otherwise, or before the text gets that far.
fn arguments_start(text: &str) -> Option<(String, usize)> {
    fn token<'a>(rest: &'a str, expected: &str) -> Option<&'a str> {
        rest.trim_start().strip_prefix(expected)
    }
    let rest = token(text, "{")?;
    let rest = token(token(rest, "\"name\"")?, ":")?.trim_start();
    let mut strings = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    let name = strings.next()?.ok()?;
    let rest = &rest[strings.byte_offset()..];
    let rest = token(rest, ",")?.trim_start();
    let rest = token(rest.strip_prefix("\"arguments\"").or_else(|| rest.strip_prefix("\"parameters\""))?, ":")?.trim_start();
    rest.starts_with('{').then(|| (name, text.len() - rest.len()))
}

fn call_of(value: &Value) -> Option<ParsedCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(arguments @ Value::Object(_)) => arguments.to_string(),
        Some(_) => return None,
    };
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CALLS: &str = "I will check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon, France\", \"unit\": \"c\"}}\n</tool_call>\n";

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall { name: name.into(), arguments: arguments.into() }
    }

    fn hermes(text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let whole = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(text);
        (whole.content, whole.calls)
    }

    fn llama(text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let whole = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX).split_whole(text);
        (whole.content, whole.calls)
    }

    /// The reply fed in pieces of `size` characters: its content, and its calls joined.
    fn streamed(parser: ToolCallParser, text: &str, size: usize) -> ((Option<String>, Vec<ParsedCall>), Vec<Parsed>) {
        streamed_within(parser, u32::MAX, text, size)
    }

    /// `streamed`, giving out at most `limit` calls.
    fn streamed_within(parser: ToolCallParser, limit: u32, text: &str, size: usize) -> ((Option<String>, Vec<ParsedCall>), Vec<Parsed>) {
        let mut splitter = ToolCallSplitter::new(parser, limit);
        let chars: Vec<char> = text.chars().collect();
        let mut pieces: Vec<Parsed> = chars.chunks(size).map(|chunk| splitter.push(&chunk.iter().collect::<String>())).collect();
        pieces.push(splitter.finish());
        let content: String = pieces.iter().map(|piece| piece.content.as_str()).collect();
        let calls = Parsed::joined_calls(pieces.iter().flat_map(|piece| piece.calls.clone()));
        ((Some(content).filter(|c| !c.is_empty()), calls), pieces)
    }

    #[test]
    fn calls_are_read_out_of_the_reply_and_the_rest_is_content() {
        let (content, calls) = hermes(TWO_CALLS);
        assert_eq!(content.as_deref(), Some("I will check both."));
        // The arguments as written.
        assert_eq!(calls, vec![
            call("get_weather", r#"{"city": "Paris"}"#),
            call("get_weather", r#"{"city": "Lyon, France", "unit": "c"}"#),
        ]);
        // A call alone has no content; a reply without calls is all content.
        assert_eq!(hermes("<tool_call>{\"name\": \"now\"}</tool_call>"), (None, vec![call("now", "{}")]));
        let plain = "The answer is 4 < 5, and <tool is not a tag.";
        assert_eq!(hermes(plain), (Some(plain.to_string()), vec![]));
        // Arguments written as a JSON string are kept as written; `parameters` is read too (as
        // written), and arguments after other keys are the JSON's.
        let (_, calls) = hermes("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call><tool_call>{\"name\": \"g\", \"parameters\": {\"b\": [1, 2]}}</tool_call><tool_call>{\"arguments\": {\"c\": 3}, \"name\": \"h\"}</tool_call>");
        assert_eq!(calls, vec![call("f", r#"{"a": 1}"#), call("g", r#"{"b": [1, 2]}"#), call("h", r#"{"c":3}"#)]);
    }

    #[test]
    fn what_is_not_a_call_stays_text() {
        // A block that is not a call's JSON, and one the reply did not close before its arguments.
        let broken = "Try: <tool_call>{\"name\": 5}</tool_call> then";
        assert_eq!(hermes(broken), (Some(broken.to_string()), vec![]));
        let cut = "<tool_call>{\"name\": \"get_weather\", \"argum";
        assert_eq!(hermes(cut), (Some(cut.to_string()), vec![]));
        let (content, calls) = hermes("<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"na");
        assert_eq!((content.as_deref(), calls.len()), (Some("\n<tool_call>{\"na"), 1));
    }

    #[test]
    fn a_call_cut_inside_its_arguments_stays_as_begun_and_is_not_called() {
        let whole = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\"");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("f", r#"{"a": 1, "b""#)], false));
        let whole = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(TWO_CALLS);
        assert!(whole.called);
    }

    #[test]
    fn a_stream_adds_up_to_the_whole_reply_however_it_is_cut() {
        for text in [
            TWO_CALLS,
            "Plain text, no call at all.\n",
            "<tool_call>{\"name\": \"now\"}</tool_call>",
            "a <tool_ca b </tool_call> c <tool_call>{\"name\": \"x\"}",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"code\": \"if a < b { x } }\", \"n\": {\"m\": 1}}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\"",
        ] {
            let whole = hermes(text);
            for size in [1, 2, 3, 7, 100] {
                assert_eq!(streamed(ToolCallParser::Hermes, text, size).0, whole, "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn a_stream_gives_content_at_once_and_arguments_as_they_grow() {
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX);
        assert_eq!(splitter.push("Let me look").content, "Let me look");
        // A possible tag's start waits; white space waits for more content.
        assert_eq!(splitter.push(".\n<tool").content, ".");
        assert_eq!(splitter.push("_call>\n{\"name\": \"get_weather\", "), Parsed::default());
        // Named once its arguments begin; then they go out, less a tail that may close them.
        let begun = splitter.push("\"arguments\": {\"city\": \"Pa");
        assert_eq!(begun.calls, vec![
            CallDelta { index: 0, name: Some("get_weather".into()), arguments: String::new() },
            CallDelta { index: 0, name: None, arguments: r#"{"city": "Pa"#.into() },
        ]);
        assert_eq!(splitter.push("ris\"}}\n</tool").calls, vec![CallDelta { index: 0, name: None, arguments: "ris\"".into() }]);
        assert_eq!(splitter.push("_call>").calls, vec![CallDelta { index: 0, name: None, arguments: "}".into() }]);
        assert_eq!(splitter.finish(), Parsed::default());
        assert!(splitter.called());
    }

    #[test]
    fn past_its_limit_a_call_is_dropped() {
        for size in [1, 5, 1000] {
            let ((_, calls), _) = streamed_within(ToolCallParser::Hermes, 1, TWO_CALLS, size);
            assert_eq!(calls, vec![call("get_weather", r#"{"city": "Paris"}"#)], "pieces of {size}");
        }
    }

    #[test]
    fn llama_replies_that_open_as_json_are_calls() {
        // The parameters as written.
        assert_eq!(llama("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
                   (None, vec![call("get_weather", r#"{"city": "Paris"}"#)]));
        // Several, `;` between them, after the tag where the text keeps it; keys in another order.
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"parameters\": {\"x\": 1}, \"name\": \"b\"}\n";
        assert_eq!(llama(two), (None, vec![call("a", "{}"), call("b", r#"{"x":1}"#)]));
        // Anything else is content: plain text, JSON that is not a call.
        for text in ["It is sunny {\"name\": \"a\"}", "{\"answer\": 4}", "{\"answer\": 4} {\"name\": \"a\"}"] {
            assert_eq!(llama(text), (Some(text.to_string()), vec![]), "{text}");
        }
        assert_eq!(llama(""), (None, vec![]));
        // What follows the calls and is not one is content.
        assert_eq!(llama("{\"name\": \"a\"}; {\"answer\": 4} done"), (Some("{\"answer\": 4} done".to_string()), vec![call("a", "{}")]));
        assert_eq!(llama("{\"name\": \"a\"} and more"), (Some("and more".to_string()), vec![call("a", "{}")]));
    }

    #[test]
    fn a_llama_call_cut_inside_its_parameters_stays_as_begun_and_is_not_called() {
        let whole = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX).split_whole("{\"name\": \"a\", \"parameters\": {\"x\"");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("a", r#"{"x""#)], false));
        // Broken inside its parameters: as begun, and the rest of the reply is dropped.
        let whole = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX).split_whole("{\"name\": \"a\", \"parameters\": {\"x\": 1 oops}; more");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("a", r#"{"x": 1"#)], false));
        // Cut before its parameters began: nothing was sent, it is the reply's text.
        let whole = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX).split_whole("{\"name\": \"a\", \"para");
        assert_eq!((whole.content.as_deref(), whole.calls.len(), whole.called), (Some("{\"name\": \"a\", \"para"), 0, false));
    }

    #[test]
    fn a_llama_stream_gives_content_at_once_and_parameters_as_they_grow() {
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX);
        assert_eq!(splitter.push("  ").content, "");
        assert_eq!(splitter.push("Sunny").content, "  Sunny");
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX);
        assert_eq!(splitter.push("<|python").content, "");
        assert_eq!(splitter.push("_tag|>{\"name\": \"a\",").content, "");
        // A call whole in one piece goes out whole.
        assert_eq!(splitter.push(" \"parameters\": {}}").calls, vec![CallDelta { index: 0, name: Some("a".into()), arguments: "{}".into() }]);
        // The next is named once its parameters begin, and they go out as they grow.
        let begun = splitter.push("; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa");
        assert_eq!(begun.calls, vec![
            CallDelta { index: 1, name: Some("get_weather".into()), arguments: String::new() },
            CallDelta { index: 1, name: None, arguments: r#"{"city": "Pa"#.into() },
        ]);
        assert_eq!(splitter.push("ris\"}").calls, vec![CallDelta { index: 1, name: None, arguments: "ris\"".into() }]);
        assert_eq!(splitter.push("}").calls, vec![CallDelta { index: 1, name: None, arguments: "}".into() }]);
        assert_eq!(splitter.finish(), Parsed::default());
        assert!(splitter.called());
        for text in [
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\"}",
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"code\": \"if a { b } }\", \"n\": {\"m\": 1}}}",
            "Plain answer.",
            "{\"nope\": 1}",
            "{\"name\": \"a\"}; {\"answer\": 4} done",
            "{\"name\": \"a\", \"parameters\": {\"x\"",
            "{\"name\": \"a\", \"parameters\": {\"x\": 1}}} broken",
            "{\"name\": \"a\", \"parameters\": {\"x\": 1 oops}}; more",
            "{\"name\": \"a\", \"parameters\": {\"é\":\n 1 oops}}; more",
            "{\"name\": 5, \"parameters\": {}} text",
        ] {
            for size in [1, 2, 3, 7, 100] {
                assert_eq!(streamed(ToolCallParser::Llama3Json, text, size).0, llama(text), "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn past_its_limit_a_llama_call_is_dropped() {
        let two = "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": 2}}";
        for size in [1, 5, 1000] {
            let ((content, calls), _) = streamed_within(ToolCallParser::Llama3Json, 1, two, size);
            assert_eq!((content, calls), (None, vec![call("a", r#"{"x": 1}"#)]), "pieces of {size}");
        }
    }

    fn mistral(text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let whole = ToolCallSplitter::new(ToolCallParser::Mistral, u32::MAX).split_whole(text);
        (whole.content, whole.calls)
    }

    #[test]
    fn mistral_calls_follow_the_marker_as_an_array_or_one_by_one() {
        // Before tokenizer v11: a JSON array (the token decodes with a space after it), the
        // arguments as written; the content before the marker is the message's.
        let array = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"now\", \"arguments\": {}}]";
        assert_eq!(mistral(array), (None, vec![call("get_weather", r#"{"city": "Paris"}"#), call("now", "{}")]));
        let (content, calls) = mistral(&format!("Let me check. {array}"));
        assert_eq!((content.as_deref(), calls.len()), (Some("Let me check."), 2));
        // From v11: `name[ARGS]{…}` after each marker; a call id after the name is read past.
        let named = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lyon, France\"}[TOOL_CALLS]now[CALL_ID]a1B2c3D4e[ARGS]{}";
        assert_eq!(mistral(named), (None, vec![call("get_weather", r#"{"city": "Lyon, France"}"#), call("now", "{}")]));
        // A lone object after the marker.
        assert_eq!(mistral("[TOOL_CALLS]{\"name\": \"now\"}"), (None, vec![call("now", "{}")]));
        // No marker: content, brackets and all.
        let plain = "Lists look like [1, 2] and [TOOL is not the marker.";
        assert_eq!(mistral(plain), (Some(plain.to_string()), vec![]));
        // What follows the marker and is not calls is content.
        assert_eq!(mistral("[TOOL_CALLS] I cannot call that."), (Some("I cannot call that.".into()), vec![]));
        assert_eq!(mistral("[TOOL_CALLS][{\"answer\": 4}]"), (Some("{\"answer\": 4}]".into()), vec![]));
    }

    #[test]
    fn a_mistral_call_cut_or_broken_stays_as_begun() {
        let whole = ToolCallSplitter::new(ToolCallParser::Mistral, u32::MAX).split_whole("[TOOL_CALLS]f[ARGS]{\"a\": 1, \"b\"");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("f", r#"{"a": 1, "b""#)], false));
        let whole = ToolCallSplitter::new(ToolCallParser::Mistral, u32::MAX).split_whole("[TOOL_CALLS]f[ARGS]{\"a\": 1 oops} and more");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("f", r#"{"a": 1"#)], false));
        let whole = ToolCallSplitter::new(ToolCallParser::Mistral, u32::MAX).split_whole("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1");
        assert_eq!((whole.content, whole.calls, whole.called), (None, vec![call("f", r#"{"a": 1"#)], false));
    }

    #[test]
    fn a_mistral_stream_adds_up_to_the_whole_reply_however_it_is_cut() {
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Mistral, u32::MAX);
        assert_eq!(splitter.push("Sure.[TOOL").content, "Sure.");
        assert_eq!(splitter.push("_CALLS]get_weather[AR"), Parsed::default());
        // Named once its arguments begin; they go out as they grow.
        let begun = splitter.push("GS]{\"city\": \"Pa");
        assert_eq!(begun.calls, vec![
            CallDelta { index: 0, name: Some("get_weather".into()), arguments: String::new() },
            CallDelta { index: 0, name: None, arguments: r#"{"city": "Pa"#.into() },
        ]);
        assert_eq!(splitter.push("ris\"}").calls, vec![CallDelta { index: 0, name: None, arguments: "ris\"}".into() }]);
        assert_eq!(splitter.finish(), Parsed::default());
        assert!(splitter.called());
        for text in [
            "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}]\"}]}}, {\"name\": \"b\", \"arguments\": {}}]",
            "Text first [TOOL_CALLS]a[ARGS]{\"code\": \"if a { b } }\"}[TOOL_CALLS]b[CALL_ID]abcdefghi[ARGS]{\"n\": 1}",
            "Plain [answer] with [TOOL and brackets.",
            "[TOOL_CALLS] not a call",
            "[TOOL_CALLS][{\"nope\": 1}, {\"name\": \"a\"}]",
            "[TOOL_CALLS]a[ARGS]{\"x\"",
            "[TOOL_CALLS]a[ARGS]{\"x\": 1 oops} more",
            "[TOOL_CALLS]a[ARGS]plain",
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}] after",
            "[TOOL_CALLS]a",
        ] {
            for size in [1, 2, 3, 7, 100] {
                assert_eq!(streamed(ToolCallParser::Mistral, text, size).0, mistral(text), "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn past_its_limit_a_mistral_call_is_dropped_and_ids_fit_mistral_templates() {
        for text in ["[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
                     "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}"] {
            for size in [1, 5, 1000] {
                let ((content, calls), _) = streamed_within(ToolCallParser::Mistral, 1, text, size);
                assert_eq!((content, calls), (None, vec![call("a", r#"{"x": 1}"#)]), "{text:?} in pieces of {size}");
            }
        }
        let id = ToolCallParser::Mistral.call_id();
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert_ne!(id, ToolCallParser::Mistral.call_id());
        assert!(ToolCallParser::Hermes.call_id().starts_with("chatcmpl-tool-"));
    }
}
