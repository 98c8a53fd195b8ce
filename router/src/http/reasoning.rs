//! Reasoning split out of chat replies (`--reasoning-parser`, vLLM's flag and field): the text a
//! thinking model writes between `<think>` and `</think>` is the message's `reasoning_content`,
//! the rest its `content`. Streamed, each piece goes to one side as it arrives; a piece that may
//! be the start of a tag waits for the next. One splitter serves the whole reply and the stream,
//! so both give the same split.

use super::openai_stream::PerChoice;
use crate::grammar::ReasoningTokens;
use crate::tokenizer::Tokenizer;

/// How a model's reply opens its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    /// Qwen 3 (and QwQ): the reply is reasoning only where it opens with `<think>`; a reply
    /// without it (`enable_thinking: false`, whose template closes an empty block in the
    /// prompt) is all content.
    Qwen3,
    /// DeepSeek-R1 (and Qwen 3 thinking-only models): the template opens `<think>` in the
    /// prompt, so the reply is reasoning from its start (an opening tag it repeats is dropped)
    /// up to `</think>`.
    #[value(name = "deepseek_r1", alias = "deepseek-r1")]
    DeepseekR1,
}

const START: &str = "<think>";
const END: &str = "</think>";

/// The tags as the model's tokens, where its tokenizer has each as one token the model can
/// sample (`vocab_size`, 0 when unknown): a chat reply under a grammar (a format, tools) then
/// reasons first and the grammar holds from the token after `</think>`. `None` otherwise: the
/// grammar holds from the reply's first token, which then has no reasoning part.
pub fn tag_tokens(tokenizer: &Tokenizer, vocab_size: u32) -> Option<ReasoningTokens> {
    let id = |tag: &str| tokenizer.token_id(tag).filter(|&id| vocab_size == 0 || id < vocab_size);
    Some(ReasoningTokens { open: id(START)?, close: id(END)? })
}

/// The tags that are special tokens of this tokenizer (some models' `<think>`): a reply decoded
/// without them would lose them, and its reasoning would read as the answer.
pub fn special_tags(tokenizer: &Tokenizer) -> Vec<u32> {
    tokenizer.special_ids_of(&[START, END])
}

impl ReasoningParser {
    /// Whether the prompt (the rendered conversation) leaves a reasoning block open, so the
    /// reply reasons from its first token: its last tag is `<think>` (DeepSeek-R1's template,
    /// Qwen 3's thinking-only models'). A last `</think>` closed it (Qwen 3's
    /// `enable_thinking: false`, or an earlier turn's reasoning): the reply may open its own.
    /// With no tag, the parser's own reading: `deepseek_r1` takes the block as opened, `qwen3`
    /// as the reply's to open.
    pub fn open_in_prompt(self, prompt: &str) -> bool {
        match (prompt.rfind(START), prompt.rfind(END)) {
            (Some(open), close) => close.is_none_or(|close| open > close),
            (None, Some(_)) => false,
            (None, None) => self == ReasoningParser::DeepseekR1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Not yet known whether the reply opens with `<think>`.
    Opening,
    Reasoning,
    Content,
}

/// What one piece of the reply adds to each side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// The state of one reply's split.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    part: Part,
    /// Text not yet given to either side: a possible tag's start, or the reply's opening.
    pending: String,
    /// Whether the reply wrote any reasoning (a message then carries `reasoning_content`).
    reasoned: bool,
}

impl ReasoningSplitter {
    /// The split of a reply to `prompt` (`ReasoningParser::open_in_prompt`).
    pub fn new(parser: ReasoningParser, prompt: &str) -> Self {
        Self { part: Part::Opening, pending: String::new(), reasoned: parser.open_in_prompt(prompt) }
    }

    /// Whether the reply has a reasoning part (it may still be empty).
    pub fn reasoned(&self) -> bool {
        self.reasoned
    }

    /// Splits the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut split = Split::default();
        loop {
            match self.part {
                Part::Opening => {
                    let opening = self.pending.trim_start();
                    if let Some(rest) = opening.strip_prefix(START) {
                        self.pending = rest.to_string();
                        (self.part, self.reasoned) = (Part::Reasoning, true);
                    } else if START.starts_with(opening) {
                        return split;
                    } else {
                        self.part = if self.reasoned { Part::Reasoning } else { Part::Content };
                    }
                }
                Part::Reasoning => match self.pending.find(END) {
                    Some(at) => {
                        split.reasoning.push_str(&self.pending[..at]);
                        self.pending.drain(..at + END.len());
                        self.part = Part::Content;
                    }
                    None => {
                        let keep = partial_tag(&self.pending, END);
                        split.reasoning.extend(self.pending.drain(..self.pending.len() - keep));
                        return split;
                    }
                },
                Part::Content => {
                    split.content.push_str(&std::mem::take(&mut self.pending));
                    return split;
                }
            }
        }
    }

    /// Releases what was held back at the end of the reply.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.pending);
        match self.part {
            Part::Reasoning => Split { reasoning: rest, content: String::new() },
            Part::Opening if self.reasoned => Split { reasoning: rest, content: String::new() },
            _ => Split { reasoning: String::new(), content: rest },
        }
    }

    /// A whole reply to `prompt`: (reasoning, when it has a reasoning part; content).
    pub fn split_whole(parser: ReasoningParser, prompt: &str, text: &str) -> (Option<String>, String) {
        let mut splitter = Self::new(parser, prompt);
        let (first, last) = (splitter.push(text), splitter.finish());
        let reasoning = splitter.reasoned().then(|| first.reasoning + &last.reasoning);
        (reasoning, first.content + &last.content)
    }
}

/// The splits of a stream's choices, by choice index.
#[derive(Debug)]
pub struct ChoiceSplitters {
    parser: ReasoningParser,
    splitters: PerChoice<ReasoningSplitter>,
}

impl ChoiceSplitters {
    pub fn new(parser: ReasoningParser) -> Self {
        Self { parser, splitters: Default::default() }
    }

    pub fn parser(&self) -> ReasoningParser {
        self.parser
    }

    /// Splits choice `index`'s next piece of its reply to `prompt`; its `last` piece releases
    /// what was held back.
    pub fn push(&self, index: u32, prompt: &str, text: &str, last: bool) -> Split {
        self.splitters.with(index, last, || ReasoningSplitter::new(self.parser, prompt), |splitter| {
            let mut split = splitter.push(text);
            if last {
                let rest = splitter.finish();
                split.reasoning.push_str(&rest.reasoning);
                split.content.push_str(&rest.content);
            }
            split
        })
    }
}

/// Bytes at the end of `text` that could begin `tag` (none when `tag` is complete in it).
pub(super) fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THOUGHT: &str = "<think>\nThe user greets me.\n</think>\n\nHello!";

    #[test]
    fn a_whole_reply_splits_at_the_closing_tag() {
        let (reasoning, content) = ReasoningSplitter::split_whole(ReasoningParser::Qwen3, "", THOUGHT);
        assert_eq!(reasoning.as_deref(), Some("\nThe user greets me.\n"));
        assert_eq!(content, "\n\nHello!");
        // Qwen 3 without thinking: no tag, all content, no reasoning field.
        assert_eq!(ReasoningSplitter::split_whole(ReasoningParser::Qwen3, "", "Hello!"), (None, "Hello!".into()));
        // DeepSeek-R1's template opened the block in the prompt: reasoning up to the end tag.
        let (reasoning, content) = ReasoningSplitter::split_whole(ReasoningParser::DeepseekR1, "", "Hmm.</think>Hi");
        assert_eq!((reasoning.as_deref(), content.as_str()), (Some("Hmm."), "Hi"));
        // Cut short while thinking: it is all reasoning, no content.
        assert_eq!(ReasoningSplitter::split_whole(ReasoningParser::DeepseekR1, "", "Hmm"), (Some("Hmm".into()), String::new()));
        assert_eq!(ReasoningSplitter::split_whole(ReasoningParser::Qwen3, "", "<think>Hm"), (Some("Hm".into()), String::new()));
    }

    #[test]
    fn streamed_pieces_split_as_the_whole_reply_does_wherever_they_are_cut() {
        let replies = [THOUGHT, "Hello <think> there", "  <thi", "<think>a</thi", "<think>é</think>ü", "</think>x"];
        for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
            for reply in replies {
                let whole = ReasoningSplitter::split_whole(parser, "", reply);
                let chars: Vec<char> = reply.chars().collect();
                for size in 1..=3 {
                    let mut splitter = ReasoningSplitter::new(parser, "");
                    let (mut reasoning, mut content) = (String::new(), String::new());
                    for piece in chars.chunks(size).map(String::from_iter) {
                        let split = splitter.push(&piece);
                        reasoning += &split.reasoning;
                        content += &split.content;
                    }
                    let last = splitter.finish();
                    reasoning += &last.reasoning;
                    content += &last.content;
                    let streamed = (splitter.reasoned().then_some(reasoning), content);
                    assert_eq!(streamed, whole, "{parser:?} {reply:?} in pieces of {size}");
                }
            }
        }
    }

    #[test]
    fn text_that_may_start_a_tag_waits_and_no_more() {
        let mut splitter = ReasoningSplitter::new(ReasoningParser::Qwen3, "");
        assert_eq!(splitter.push("<thi"), Split::default());
        assert_eq!(splitter.push("nk>plan</th"), Split { reasoning: "plan".into(), content: String::new() });
        assert_eq!(splitter.push("ink>Hi"), Split { reasoning: String::new(), content: "Hi".into() });
        assert_eq!(splitter.push(" <"), Split { reasoning: String::new(), content: " <".into() });
    }

    /// The prompt decides where the reply starts: a last `<think>` opened the block, a last
    /// `</think>` closed it, and with none the parser's own reading holds.
    #[test]
    fn the_prompts_last_tag_says_whether_the_reply_starts_reasoning() {
        let (opened, closed) = ("<user>Hi<assistant><think>\n", "<user>Hi<assistant><think>\n\n</think>\n\n");
        let history = "<assistant><think>a</think>Yes<user>And?<assistant>";
        for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
            assert!(parser.open_in_prompt(opened));
            assert!(!parser.open_in_prompt(closed) && !parser.open_in_prompt(history));
            // A template that closed the block: the answer is content, under either parser.
            assert_eq!(ReasoningSplitter::split_whole(parser, closed, "{\"ok\": true}"), (None, "{\"ok\": true}".into()));
            assert_eq!(ReasoningSplitter::split_whole(parser, opened, "Hm.</think>Hi"), (Some("Hm.".into()), "Hi".into()));
        }
        assert!(ReasoningParser::DeepseekR1.open_in_prompt("<user>Hi<assistant>"));
        assert!(!ReasoningParser::Qwen3.open_in_prompt("<user>Hi<assistant>"));
    }
}
