//! The model's chat template (Jinja, from the shard's `Info`), compiled once with minijinja and
//! rendered per chat request. Python string methods that Hugging Face templates call
//! (`.strip()`, `.startswith()`, …) come from minijinja-contrib's pycompat layer, and
//! whitespace control follows transformers (`trim_blocks`, `lstrip_blocks`), as do the
//! extras transformers gives templates: `raise_exception`, `strftime_now`, its own `tojson`,
//! and loop controls (`break`, `continue`).
use std::fmt::Write as _;
use std::io;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;

const TEMPLATE_NAME: &str = "chat";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("the model has no chat template")]
    Missing,
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    #[error("{0}")]
    Render(String),
}

/// One message as the template sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, as Hugging Face templates read them: `{"type":
    /// "function", "function": {"name", "arguments"}}`, the arguments an object where the
    /// caller's JSON string parses. Only for templates that render `tool_calls`; for the others
    /// the calls are written in `content` (`ChatTemplate::renders_tool_calls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// The call a tool's result answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning (vLLM's `reasoning_content`), for templates that write it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl TemplateMessage {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, reasoning_content: None }
    }
}

/// A compiled template plus the special tokens it may refer to.
pub struct ChatTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
    renders_tool_calls: bool,
    renders_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .finish()
    }
}

/// Templates call `raise_exception("…")` to reject conversations they cannot express.
fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `strftime_now(format)`: the local time, formatted as by `strftime`.
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let mut text = String::new();
    write!(text, "{}", chrono::Local::now().format(&format))
        .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, format!("`strftime_now`: bad format {format:?}")))?;
    Ok(text)
}

/// transformers' `tojson`, which is Python's `json.dumps`: `", "` and `": "` between items (or
/// `indent=N`), no HTML escaping, characters written as they are. minijinja's own writes no
/// spaces and escapes `<`, `>` and `&`, which changes the tokens a model was trained on (the
/// tools in Llama 3.1's and Qwen 2.5's system prompts). Other keyword arguments are accepted
/// and take their defaults.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let mut out = Vec::new();
    let written = match indent {
        Some(width) => {
            let spaces = vec![b' '; width];
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&spaces)))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonJson)),
    };
    let bad = |error: String| minijinja::Error::new(ErrorKind::InvalidOperation, format!("`tojson`: {error}"));
    written.map_err(|error| bad(error.to_string()))?;
    String::from_utf8(out).map(Value::from_safe_string).map_err(|error| bad(error.to_string()))
}

/// `json.dumps`'s default separators.
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self, TemplateError> {
        let mut environment = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|error| TemplateError::Syntax(error.to_string()))?;
        environment.set_syntax(syntax);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        environment.add_function("raise_exception", raise_exception);
        environment.add_function("strftime_now", strftime_now);
        environment.add_filter("tojson", tojson);
        environment
            .add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|error| TemplateError::Syntax(error.to_string()))?;
        Ok(Self {
            environment,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
            renders_tool_calls: source.contains("tool_calls"),
            renders_tools: source.contains("tools"),
        })
    }

    /// Whether the template reads a message's `tool_calls` (Llama 3.1's, Qwen 2.5's, Mistral's
    /// do). For one that does not, an assistant's calls are written in its content as JSON, as
    /// TGI does, so the model still sees what it called before the tools' results.
    pub fn renders_tool_calls(&self) -> bool {
        self.renders_tool_calls
    }

    /// Whether the template reads the request's `tools` (writes them, with its model's own
    /// instruction for calling them, into the prompt), as Qwen's, Hermes', Llama 3.1's and
    /// Mistral's do.
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// The messages alone, as the tests render them.
    #[cfg(test)]
    pub fn render(&self, messages: &[TemplateMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let conversation = Conversation { messages: messages.to_vec(), add_generation_prompt, ..Conversation::default() };
        self.render_conversation(&conversation)
    }

    /// A conversation as the template writes it. With `continue_final_message`, the text stops
    /// where the last message's content ends (no end of turn), so the model continues that
    /// message, as transformers' `apply_chat_template` does: the content is marked, rendered,
    /// and cut at the mark (before any whitespace the template trimmed after it).
    pub fn render_conversation(&self, conversation: &Conversation) -> Result<String, TemplateError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(|error| TemplateError::Render(error.to_string()))?;
        let mut messages = std::borrow::Cow::Borrowed(&conversation.messages);
        if conversation.continue_final_message {
            match messages.to_mut().last_mut() {
                Some(last) if !last.content.is_empty() => last.content.push_str(CONTINUE_MARK),
                _ => return Err(TemplateError::Render("`continue_final_message`: the final message has no content to continue".into())),
            }
        }
        let rendered = template
            .render(context! {
                messages => Value::from(Serde(&*messages)),
                tools => conversation.tools.as_ref().map(|tools| Value::from(Serde(tools))),
                add_generation_prompt => conversation.add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..Value::from(Serde(&conversation.variables))
            })
            .map_err(|error| TemplateError::Render(render_message(&error)))?;
        if !conversation.continue_final_message {
            return Ok(rendered);
        }
        let Some(at) = rendered.rfind(CONTINUE_MARK.trim_end()) else {
            return Err(TemplateError::Render(
                "`continue_final_message`: the template does not write the final message's content as given".into(),
            ));
        };
        Ok(match rendered[at..].starts_with(CONTINUE_MARK) {
            true => rendered[..at].to_string(),
            false => rendered[..at].trim_end().to_string(),
        })
    }
}

/// Marks the end of the message to continue; its trailing space tells whether the template
/// trims the content's end.
const CONTINUE_MARK: &str = "\u{1F}CONTINUE_FINAL_MESSAGE ";

/// A conversation and how to render it: the request's tools, and the options OpenAI-compatible
/// servers take beside the messages (`add_generation_prompt`, `continue_final_message`,
/// `chat_template_kwargs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub messages: Vec<TemplateMessage>,
    pub tools: Option<serde_json::Value>,
    /// Ends with the header of the assistant's turn, for the model to answer.
    pub add_generation_prompt: bool,
    /// Ends inside the last message, for the model to continue it.
    pub continue_final_message: bool,
    /// More variables the template reads (Qwen 3's `enable_thinking`); they cannot replace the
    /// ones above (`Conversation::RESERVED`).
    pub variables: serde_json::Map<String, serde_json::Value>,
}

impl Conversation {
    /// The variables every rendering sets itself.
    pub const RESERVED: [&'static str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];
}

/// A template's own `raise_exception` text, or minijinja's description of the failure.
fn render_message(error: &minijinja::Error) -> String {
    match error.kind() {
        ErrorKind::InvalidOperation => error.detail().unwrap_or("invalid operation").to_string(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm2() -> ChatTemplate {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/smollm2_chat_template.jinja"
        );
        let source = std::fs::read_to_string(path).expect("fixture chat template");
        ChatTemplate::new(&source, Some("<|im_start|>"), Some("<|im_end|>")).unwrap()
    }

    fn message(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage::new(role, content)
    }

    /// The extras transformers gives templates, as Llama 3.1's and Qwen 2.5's use them. The
    /// expected string is transformers' own rendering of this template (4.x,
    /// `_compile_jinja_template(source).render(messages=…, tools=…)`).
    #[test]
    fn tojson_strftime_now_and_loop_controls_are_transformers_own() {
        let source = "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{{ m.content }};\
            {% if m.role == 'last' %}{% break %}{% endif %}{% endfor %}{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|\
            {{ strftime_now('%Y') | length }}";
        let template = ChatTemplate::new(source, None, None).unwrap();
        let tools: serde_json::Value = serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "a<b>&", "z": [1, 2.5, "日本"], "a": {}}}]"#,
        )
        .unwrap();
        let messages = vec![message("user", "1"), message("skip", "2"), message("last", "3"), message("user", "4")];
        let conversation = Conversation { messages, tools: Some(tools), ..Conversation::default() };
        let rendered = template.render_conversation(&conversation).unwrap();
        assert_eq!(
            rendered,
            "1;3;[{\"type\": \"function\", \"function\": {\"name\": \"a<b>&\", \"z\": [1, 2.5, \"日本\"], \"a\": {}}}]|\
             {\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"a<b>&\",\n    \"z\": [\n      1,\n      2.5,\n      \"日本\"\n    ],\n    \"a\": {}\n  }\n}|4"
        );
    }

    /// transformers' `continue_final_message`: the text ends where the last message's content
    /// does, whether the template keeps its trailing space or trims it.
    #[test]
    fn continuing_the_final_message_ends_inside_it() {
        let conversation = |content: &str| Conversation {
            messages: vec![message("user", "Hi"), message("assistant", content)],
            continue_final_message: true,
            ..Conversation::default()
        };
        let rendered = smollm2().render_conversation(&conversation("The answer is")).unwrap();
        assert!(rendered.ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is"), "{rendered:?}");
        let trimming = ChatTemplate::new("{% for m in messages %}[{{ m.content | trim }}]{% endfor %}", None, None).unwrap();
        assert_eq!(trimming.render_conversation(&conversation("abc ")).unwrap(), "[Hi][abc");
        let keeping = ChatTemplate::new("{% for m in messages %}[{{ m.content }}]{% endfor %}", None, None).unwrap();
        assert_eq!(keeping.render_conversation(&conversation("abc ")).unwrap(), "[Hi][abc ");
        // A template that drops the content, and a last message with none, cannot be continued.
        let dropping = ChatTemplate::new("{% for m in messages %}[{{ m.role }}]{% endfor %}", None, None).unwrap();
        assert!(dropping.render_conversation(&conversation("abc")).is_err());
        assert!(smollm2().render_conversation(&conversation("")).is_err());
    }

    #[test]
    fn template_variables_reach_the_template() {
        let template = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ messages[0].content }}",
            None,
            None,
        )
        .unwrap();
        let mut conversation = Conversation { messages: vec![message("user", "Hi")], ..Conversation::default() };
        assert_eq!(template.render_conversation(&conversation).unwrap(), "Hi");
        conversation.variables.insert("enable_thinking".into(), serde_json::Value::Bool(false));
        assert_eq!(template.render_conversation(&conversation).unwrap(), "<think></think>Hi");
    }

    #[test]
    fn smollm2_template_adds_default_system_prompt_and_generation_prompt() {
        // Expected strings from transformers' `apply_chat_template` on the embedded model.
        let rendered = smollm2()
            .render(&[message("user", "Hello, who are you?")], true)
            .unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nHello, who are you?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn smollm2_template_keeps_a_given_system_prompt_and_history() {
        let messages = [
            message("system", "Be brief."),
            message("user", "Hi"),
            message("assistant", "Hello!"),
            message("user", "2+2?"),
        ];
        assert_eq!(
            smollm2().render(&messages, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        );
    }

    #[test]
    fn python_string_methods_and_special_tokens_work() {
        let template = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}{{ m['content'].strip().upper() }}\
             {% if m.role.startswith('u') %}?{% endif %}{% endfor %}{{ eos_token }}",
            Some("<s>"),
            Some("</s>"),
        )
        .unwrap();
        assert_eq!(
            template
                .render(&[message("user", "  hi  ")], false)
                .unwrap(),
            "<s>HI?</s>"
        );
    }

    #[test]
    fn raise_exception_becomes_a_template_error() {
        let template = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}",
            None,
            None,
        )
        .unwrap();
        let error = template
            .render(&[message("assistant", "x")], false)
            .unwrap_err();
        assert_eq!(
            error,
            TemplateError::Render("Conversation must start with user".into())
        );
    }

    #[test]
    fn broken_template_is_a_syntax_error() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", None, None),
            Err(TemplateError::Syntax(_))
        ));
    }
}
