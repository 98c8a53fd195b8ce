//! Tool calls in the model's own format (`--tool-call-parser`, vLLM's flag): with
//! `tool_choice: "auto"` the reply is generated freely, as the model was trained to call tools,
//! and the calls are read out of it — any number of them (`parallel_tool_calls`). Without the
//! flag, or with `required` or a named function, the calls are generated under TGI's grammar
//! (`tools`), one per reply.
//!
//! `hermes` (Qwen 2.5 and 3, Hermes, and the many models trained on its format): each call is
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; the text around the calls is the
//! message's content. Streamed, content goes out as it comes (a piece that may start a tag waits
//! for the next), and each call as one delta once its closing tag is read.
//!
//! `llama3_json` (Llama 3.1, 3.2 and 3.3): a reply that is calls is JSON from its start —
//! `{"name": …, "parameters": {…}}`, several separated by `;` (after `<|python_tag|>`, where the
//! text keeps it) — and any other reply is content. Streamed, a reply that opens with `{` is
//! held until its end, then read as calls (as its text when it is not).
//!
//! One splitter serves the whole reply and the stream, so both give the same calls and content.
use serde_json::Value;

use super::reasoning::partial_tag;

/// The model's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call.
    Hermes,
    /// A reply that is JSON calls, `{"name": …, "parameters": {…}}`, `;` between them.
    #[value(name = "llama3_json", alias = "llama3-json")]
    Llama3Json,
}

/// Llama 3's marker before a call, where the reply's text keeps special tokens.
const PYTHON_TAG: &str = "<|python_tag|>";

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// One call read out of the reply: the tool's name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// What one piece of the reply adds: content, and the calls it completes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

/// The state of one reply's reading.
#[derive(Debug, Clone)]
pub struct ToolCallSplitter {
    parser: ToolCallParser,
    /// `llama3_json`: the reply's start is not yet read (white space, or part of the tag).
    opening: bool,
    /// `llama3_json`: the reply opened as JSON, held whole in `pending` until its end.
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
    /// Calls read so far (the next one's index).
    calls: u32,
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
        }
    }

    /// Reads the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Parsed {
        self.pending.push_str(text);
        if self.parser == ToolCallParser::Llama3Json {
            return self.push_json();
        }
        let mut parsed = Parsed::default();
        loop {
            if self.in_call {
                let Some(at) = self.pending.find(END) else { return parsed };
                let body: String = self.pending.drain(..at + END.len()).take(at).collect();
                self.in_call = false;
                match read_call(&body) {
                    Some(call) => self.give(call, &mut parsed),
                    // Not a call after all: the block is the message's text, as written.
                    None => self.content(&format!("{START}{body}{END}"), &mut parsed),
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

    /// Calls read so far.
    pub fn calls_read(&self) -> u32 {
        self.calls
    }

    /// Releases what was held back at the end of the reply: a possible tag's start, or a block
    /// the reply did not close (cut by its token limit), as text. White space at the end is
    /// not content.
    pub fn finish(&mut self) -> Parsed {
        let rest = std::mem::take(&mut self.pending);
        let mut parsed = Parsed::default();
        if self.json {
            self.json = false;
            match read_json_calls(&rest) {
                Some(calls) => {
                    for call in calls {
                        self.give(call, &mut parsed);
                    }
                }
                None => self.content(&rest, &mut parsed),
            }
            self.space.clear();
            return parsed;
        }
        let rest = if self.in_call { format!("{START}{rest}") } else { rest };
        self.in_call = false;
        self.content(&rest, &mut parsed);
        self.space.clear();
        parsed
    }

    /// `llama3_json`: the reply's start decides whether it is calls (held to its end) or
    /// content (given out as it comes).
    fn push_json(&mut self) -> Parsed {
        let mut parsed = Parsed::default();
        if self.json {
            return parsed;
        }
        if self.opening {
            let head = self.pending.trim_start();
            let after_tag = head.strip_prefix(PYTHON_TAG).map(str::trim_start);
            if head.is_empty() || (after_tag.is_none() && PYTHON_TAG.starts_with(head)) || after_tag == Some("") {
                return parsed;
            }
            self.opening = false;
            if after_tag.unwrap_or(head).starts_with('{') {
                self.json = true;
                return parsed;
            }
        }
        let text = std::mem::take(&mut self.pending);
        self.content(&text, &mut parsed);
        parsed
    }

    /// Gives out a call, within the limit.
    fn give(&mut self, call: ParsedCall, parsed: &mut Parsed) {
        self.space.clear();
        if self.calls < self.limit {
            self.calls += 1;
            parsed.calls.push(call);
        }
    }

    /// A whole reply: its content (none when it is only white space) and its calls.
    pub fn split_whole(mut self, text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let (first, last) = (self.push(text), self.finish());
        let content = first.content + &last.content;
        let calls = first.calls.into_iter().chain(last.calls).collect();
        ((!content.is_empty()).then_some(content), calls)
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

/// A reply of JSON calls (`llama3_json`): objects separated by `;` or white space, after an
/// optional `<|python_tag|>`; `None` unless every one is a call.
fn read_json_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text.trim_start();
    rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if rest.is_empty() {
            return (!calls.is_empty()).then_some(calls);
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        rest = &rest[values.byte_offset()..];
        calls.push(call_of(&value)?);
    }
}

/// `{"name": "f", "arguments": {…}}` (or `parameters`, or the arguments as a JSON string) -> a
/// call; `None` when the block is not one.
fn read_call(body: &str) -> Option<ParsedCall> {
    call_of(&serde_json::from_str(body.trim()).ok()?)
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

    #[test]
    fn calls_are_read_out_of_the_reply_and_the_rest_is_content() {
        let (content, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(TWO_CALLS);
        assert_eq!(content.as_deref(), Some("I will check both."));
        assert_eq!(calls, vec![
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_weather", r#"{"city":"Lyon, France","unit":"c"}"#),
        ]);
        // A call alone has no content; a reply without calls is all content.
        let (content, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole("<tool_call>{\"name\": \"now\"}</tool_call>");
        assert_eq!((content, calls), (None, vec![call("now", "{}")]));
        let plain = "The answer is 4 < 5, and <tool is not a tag.";
        assert_eq!(ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(plain), (Some(plain.to_string()), vec![]));
        // Arguments written as a JSON string are kept as written; `parameters` is read too.
        let (_, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call><tool_call>{\"name\": \"g\", \"parameters\": {\"b\": [1, 2]}}</tool_call>");
        assert_eq!(calls, vec![call("f", r#"{"a": 1}"#), call("g", r#"{"b":[1,2]}"#)]);
    }

    fn llama(text: &str) -> (Option<String>, Vec<ParsedCall>) {
        ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX).split_whole(text)
    }

    #[test]
    fn llama_replies_that_open_as_json_are_calls() {
        assert_eq!(llama("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
                   (None, vec![call("get_weather", r#"{"city":"Paris"}"#)]));
        // Several, `;` between them, after the tag where the text keeps it.
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}\n";
        assert_eq!(llama(two), (None, vec![call("a", "{}"), call("b", r#"{"x":1}"#)]));
        // Anything else is content: plain text, JSON that is not a call, JSON cut short.
        for text in ["It is sunny {\"name\": \"a\"}", "{\"answer\": 4}", "{\"name\": \"a\", \"parameters\": {\"x\"", "{\"name\": \"a\"} and more"] {
            assert_eq!(llama(text), (Some(text.to_string()), vec![]), "{text}");
        }
        assert_eq!(llama(""), (None, vec![]));
    }

    #[test]
    fn a_llama_stream_gives_content_at_once_and_holds_json_to_its_end() {
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX);
        assert_eq!(splitter.push("  ").content, "");
        assert_eq!(splitter.push("Sunny").content, "  Sunny");
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX);
        assert_eq!(splitter.push("<|python").content, "");
        assert_eq!(splitter.push("_tag|>{\"name\": \"a\",").content, "");
        assert_eq!(splitter.push(" \"parameters\": {}}"), Parsed::default());
        assert_eq!(splitter.finish(), Parsed { content: String::new(), calls: vec![call("a", "{}")] });
        for text in ["{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\"}", "Plain answer.", "{\"nope\": 1}"] {
            let whole = llama(text);
            for size in [1, 3] {
                let mut splitter = ToolCallSplitter::new(ToolCallParser::Llama3Json, u32::MAX);
                let chars: Vec<char> = text.chars().collect();
                let mut pieces: Vec<Parsed> = chars.chunks(size).map(|chunk| splitter.push(&chunk.iter().collect::<String>())).collect();
                pieces.push(splitter.finish());
                let content: String = pieces.iter().map(|piece| piece.content.as_str()).collect();
                let calls: Vec<ParsedCall> = pieces.into_iter().flat_map(|piece| piece.calls).collect();
                assert_eq!((Some(content).filter(|c| !c.is_empty()), calls), whole, "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn past_its_limit_a_call_is_dropped() {
        let (content, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, 1).split_whole(TWO_CALLS);
        assert_eq!((content.as_deref(), calls), (Some("I will check both."), vec![call("get_weather", r#"{"city":"Paris"}"#)]));
    }

    #[test]
    fn what_is_not_a_call_stays_text() {
        // A block that is not a call's JSON, and one the reply did not close.
        let broken = "Try: <tool_call>{\"name\": 5}</tool_call> then";
        assert_eq!(ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(broken), (Some(broken.to_string()), vec![]));
        let cut = "<tool_call>{\"name\": \"get_weather\", \"argum";
        assert_eq!(ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(cut), (Some(cut.to_string()), vec![]));
        let (content, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole("<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"na");
        assert_eq!((content.as_deref(), calls.len()), (Some("\n<tool_call>{\"na"), 1));
    }

    #[test]
    fn a_stream_adds_up_to_the_whole_reply_however_it_is_cut() {
        for text in [TWO_CALLS, "Plain text, no call at all.\n", "<tool_call>{\"name\": \"now\"}</tool_call>", "a <tool_ca b </tool_call> c <tool_call>{\"name\": \"x\"}"] {
            let (content, calls) = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX).split_whole(text);
            for size in [1, 2, 3, 7, 100] {
                let mut splitter = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX);
                let (mut streamed, mut streamed_calls) = (String::new(), Vec::new());
                let chars: Vec<char> = text.chars().collect();
                let mut pieces: Vec<Parsed> = chars.chunks(size).map(|chunk| splitter.push(&chunk.iter().collect::<String>())).collect();
                pieces.push(splitter.finish());
                for piece in pieces {
                    streamed.push_str(&piece.content);
                    streamed_calls.extend(piece.calls);
                }
                assert_eq!((Some(streamed).filter(|s| !s.is_empty()), streamed_calls), (content.clone(), calls.clone()), "{text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn a_stream_gives_content_at_once_and_each_call_when_it_closes() {
        let mut splitter = ToolCallSplitter::new(ToolCallParser::Hermes, u32::MAX);
        assert_eq!(splitter.push("Let me look").content, "Let me look");
        // A possible tag's start waits; white space waits for more content.
        assert_eq!(splitter.push(".\n<tool").content, ".");
        let opened = splitter.push("_call>\n{\"name\": \"now\", ");
        assert_eq!(opened, Parsed::default());
        let closed = splitter.push("\"arguments\": {}}\n</tool_call>\n");
        assert_eq!(closed, Parsed { content: String::new(), calls: vec![call("now", "{}")] });
        assert_eq!(splitter.finish(), Parsed::default());
    }
}
