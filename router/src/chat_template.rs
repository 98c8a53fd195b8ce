//! The model's chat template (Jinja, from the shard's `Info`), compiled once with minijinja and
//! rendered per chat request. Python string methods that Hugging Face templates call
//! (`.strip()`, `.startswith()`, …) come from minijinja-contrib's pycompat layer, and
//! whitespace control follows transformers (`trim_blocks`, `lstrip_blocks`).
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
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
}

/// A compiled template plus the special tokens it may refer to.
pub struct ChatTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
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
        environment
            .add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|error| TemplateError::Syntax(error.to_string()))?;
        Ok(Self {
            environment,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// `render` with the request's tools (OpenAI's definitions), which templates that know
    /// tools read as `tools`.
    pub fn render_with_tools(
        &self,
        messages: &[TemplateMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(|error| TemplateError::Render(error.to_string()))?;
        template
            .render(context! {
                messages => Value::from(Serde(messages)),
                tools => tools.map(|tools| Value::from(Serde(tools))),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|error| TemplateError::Render(render_message(&error)))
    }
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
        TemplateMessage {
            role: role.into(),
            content: content.into(),
        }
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
