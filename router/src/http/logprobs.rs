//! OpenAI's log-probabilities, as both routes answer them: chat's `logprobs.content` and the
//! legacy completions' `logprobs` (with `text_offset`, and the prompt's tokens under `echo`).
//!
//! A token is named by its own bytes, the same way wherever it appears (sampled, among the
//! alternatives, in an echoed prompt): its text when the bytes are whole UTF-8 characters,
//! else `bytes:\xNN…`, OpenAI's spelling for part of a character. So a byte-level token of an
//! emoji is never an empty string in one place and U+FFFD in another, and the sampled token is
//! found among its alternatives under its own name (lm-evaluation-harness's `is_greedy`).
//! `text_offset` is where the text a token completes starts in the choice's text: the tokens of
//! one character share its offset.
use serde_json::json;

use super::generation::GenerationOutput;
use super::openai_types::{ChatLogprob, ChatLogprobs, TopLogprob};
use super::types::{PrefillToken, Token};
use crate::detokenizer::IncrementalDecoder;
use crate::tokenizer::Tokenizer;

/// A token's name in OpenAI's logprobs, and its bytes (chat's `bytes`).
pub(crate) fn token_name(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id).unwrap_or_default();
    let name = match std::str::from_utf8(&bytes) {
        Ok(text) => text.to_string(),
        Err(_) => bytes.iter().fold(String::from("bytes:"), |name, byte| name + &format!("\\x{byte:02x}")),
    };
    (name, bytes)
}

/// Chat's `logprobs.content`: each sampled token with its alternatives.
pub(crate) fn chat_logprobs(tokenizer: &Tokenizer, tokens: &[Token], top_tokens: &[Vec<Token>]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .enumerate()
        .map(|(position, token)| {
            let (name, bytes) = token_name(tokenizer, token.id);
            let alternatives = top_tokens.get(position).map(Vec::as_slice).unwrap_or_default();
            ChatLogprob {
                token: name,
                logprob: token.logprob,
                bytes: Some(bytes),
                top_logprobs: alternatives
                    .iter()
                    .map(|top| {
                        let (name, bytes) = token_name(tokenizer, top.id);
                        TopLogprob { token: name, logprob: top.logprob, bytes: Some(bytes) }
                    })
                    .collect(),
            }
        })
        .collect();
    ChatLogprobs { content }
}

/// One token of the legacy completions' logprobs.
pub(crate) struct LegacyToken<'a> {
    id: u32,
    /// How many characters of the choice's text this token completes (0 mid-character and for
    /// a special token, which is not in the text).
    chars: usize,
    /// `None` for the first token of an echoed prompt, which nothing predicts.
    logprob: Option<f32>,
    /// The most likely tokens at its position; `None` (null) where `logprob` is.
    alternatives: Option<&'a [Token]>,
}

impl<'a> LegacyToken<'a> {
    /// A sampled token: `token.text` is the text it released (TGI's token text).
    pub(crate) fn generated(token: &'a Token, alternatives: &'a [Token]) -> Self {
        LegacyToken {
            id: token.id,
            chars: if token.special { 0 } else { token.text.chars().count() },
            logprob: Some(token.logprob),
            alternatives: Some(alternatives),
        }
    }
}

/// The legacy completions' `logprobs`: each token's name, logprob, alternatives (the token
/// itself among them) and, from `offsets_from` on, where its text starts in the choice's.
pub(crate) fn legacy_logprobs<'a>(
    tokenizer: &Tokenizer,
    tokens: impl IntoIterator<Item = LegacyToken<'a>>,
    offsets_from: Option<usize>,
) -> serde_json::Value {
    let (mut names, mut logprobs, mut tops, mut text_offset) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut offset = offsets_from.unwrap_or_default();
    for token in tokens {
        text_offset.push(offset);
        offset += token.chars;
        let name = token_name(tokenizer, token.id).0;
        tops.push(token.alternatives.map(|alternatives| {
            let mut map = serde_json::Map::new();
            for top in alternatives {
                map.insert(token_name(tokenizer, top.id).0, json!(top.logprob));
            }
            if let Some(logprob) = token.logprob {
                map.insert(name.clone(), json!(logprob));
            }
            map
        }));
        names.push(name);
        logprobs.push(token.logprob);
    }
    let mut logprobs = json!({"tokens": names, "token_logprobs": logprobs, "top_logprobs": tops});
    if offsets_from.is_some() {
        logprobs["text_offset"] = json!(text_offset);
    }
    logprobs
}

/// A choice's logprobs; with `echo`, the prompt's tokens first (with `top_n` alternatives each,
/// as the generated tokens), and the generated tokens' offsets counted from the end of the
/// prompt's text as the choice shows it.
pub(crate) fn choice_logprobs(
    tokenizer: &Tokenizer,
    output: &GenerationOutput,
    echo: Option<&str>,
    top_n: usize,
) -> serde_json::Value {
    let prompt = match echo {
        Some(_) => {
            // vLLM's `prompt_logprobs` may have asked for more alternatives at the prompt's positions.
            let tops: Vec<Vec<Token>> =
                output.prefill_top_tokens.iter().map(|top| top.iter().take(top_n).cloned().collect()).collect();
            prompt_logprobs(tokenizer, &output.prefill, &tops, Some(0))
        }
        None => prompt_logprobs(tokenizer, &[], &[], Some(0)),
    };
    let generated = output
        .tokens
        .iter()
        .enumerate()
        .map(|(position, token)| LegacyToken::generated(token, output.top_tokens.get(position).map(Vec::as_slice).unwrap_or_default()));
    let generated = legacy_logprobs(tokenizer, generated, Some(echo.map_or(0, |text| text.chars().count())));
    joined(prompt, generated)
}

/// An echoed prompt's legacy logprobs (`prefill_top_tokens[i - 1]`: the alternatives at
/// position i; the first token has none), offsets from `offsets_from` as `legacy_logprobs`.
pub(crate) fn prompt_logprobs(
    tokenizer: &Tokenizer,
    prefill: &[PrefillToken],
    prefill_top_tokens: &[Vec<Token>],
    offsets_from: Option<usize>,
) -> serde_json::Value {
    // What each prompt token completes of the prompt's text, decoded as generated text is.
    let mut decoder = IncrementalDecoder::new(&[], true);
    let prompt = prefill.iter().enumerate().map(move |(position, token)| {
        let alternatives = position
            .checked_sub(1)
            .map(|i| prefill_top_tokens.get(i).map(Vec::as_slice).unwrap_or_default());
        LegacyToken {
            id: token.id,
            chars: decoder.push(tokenizer, token.id).map(|text| text.chars().count()).unwrap_or_default(),
            logprob: token.logprob,
            alternatives: alternatives.filter(|_| token.logprob.is_some()),
        }
    });
    legacy_logprobs(tokenizer, prompt, offsets_from)
}

/// vLLM's `prompt_logprobs`: per prompt position, `null` for the first, else the token id ->
/// `{logprob, rank, decoded_token}` of the prompt's token, then of the `top_n` most likely tokens
/// there (ranks 1, 2, …; the prompt's token once if among them). An impossible token's -inf
/// logprob is written -9999.0, as vLLM writes it (JSON has no infinity).
pub(crate) fn vllm_prompt_logprobs(
    tokenizer: &Tokenizer,
    prefill: &[PrefillToken],
    prefill_top_tokens: &[Vec<Token>],
    top_n: usize,
) -> Vec<Option<serde_json::Map<String, serde_json::Value>>> {
    let entry = |id: u32, logprob: f32, rank: Option<u32>| {
        let logprob = if logprob == f32::NEG_INFINITY { -9999.0 } else { logprob };
        (id.to_string(), json!({"logprob": logprob, "rank": rank, "decoded_token": tokenizer.token_text(id)}))
    };
    prefill
        .iter()
        .enumerate()
        .map(|(position, token)| {
            let logprob = token.logprob?;
            let mut map = serde_json::Map::new();
            let (id, value) = entry(token.id, logprob, token.rank);
            map.insert(id, value);
            let alternatives = position.checked_sub(1).and_then(|i| prefill_top_tokens.get(i)).map(Vec::as_slice);
            for (rank, top) in alternatives.unwrap_or_default().iter().take(top_n).enumerate() {
                if top.id != token.id {
                    let (id, value) = entry(top.id, top.logprob, Some(rank as u32 + 1));
                    map.insert(id, value);
                }
            }
            Some(map)
        })
        .collect()
}

/// Two runs of legacy logprobs as one (each field's lists one after the other).
fn joined(mut first: serde_json::Value, second: serde_json::Value) -> serde_json::Value {
    for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(list), Some(more)) = (first[field].as_array_mut(), second[field].as_array()) {
            list.extend(more.iter().cloned());
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::generation::Timings;
    use crate::http::types::PrefillToken;
    use crate::tokenizer::tests::smollm2;

    fn token(tokenizer: &Tokenizer, id: u32, text: &str, logprob: f32) -> Token {
        Token { id, text: text.to_string(), logprob, special: tokenizer.is_special(id) }
    }

    #[test]
    fn part_of_a_character_is_named_by_its_bytes() {
        let tokenizer = smollm2();
        let ids = tokenizer.encode("☕", false).unwrap().ids;
        assert!(ids.len() > 1, "the fixture splits ☕ into byte tokens: {ids:?}");
        let names: Vec<String> = ids.iter().map(|&id| token_name(&tokenizer, id).0).collect();
        assert!(names.iter().all(|name| name.starts_with("bytes:\\x")), "{names:?}");
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| token_name(&tokenizer, id).1).collect();
        assert_eq!(bytes, "☕".as_bytes());
        let hello = tokenizer.encode(" Hello", false).unwrap().ids;
        assert_eq!(token_name(&tokenizer, hello[0]), (" Hello".to_string(), b" Hello".to_vec()));
    }

    /// The tokens of one emoji, sampled: the text is released with the last (TGI's token text),
    /// but every token is named by its bytes, its alternatives the same way, so the sampled
    /// token is among them once, and the offsets point at the emoji.
    #[test]
    fn a_sampled_emoji_keeps_its_names_and_offsets() {
        let tokenizer = smollm2();
        let ids = tokenizer.encode("a☕", false).unwrap().ids;
        let pieces = ["a", "", "", "☕"];
        assert_eq!(ids.len(), pieces.len(), "{ids:?}");
        let tokens: Vec<Token> = ids.iter().zip(pieces).map(|(&id, text)| token(&tokenizer, id, text, -0.5)).collect();
        let tops: Vec<Vec<Token>> = ids.iter().map(|&id| vec![token(&tokenizer, id, "\u{FFFD}", -0.5)]).collect();
        let logprobs = legacy_logprobs(
            &tokenizer,
            tokens.iter().zip(&tops).map(|(token, tops)| LegacyToken::generated(token, tops)),
            Some(0),
        );
        assert_eq!(logprobs["text_offset"], json!([0, 1, 1, 1]));
        for (position, top) in logprobs["top_logprobs"].as_array().unwrap().iter().enumerate() {
            let name = logprobs["tokens"][position].as_str().unwrap();
            assert_eq!(top.as_object().unwrap().keys().collect::<Vec<_>>(), vec![name]);
        }
        let chat = chat_logprobs(&tokenizer, &tokens, &tops);
        let bytes: Vec<u8> = chat.content.iter().flat_map(|entry| entry.bytes.clone().unwrap()).collect();
        assert_eq!(bytes, "a☕".as_bytes());
        assert!(chat.content.iter().all(|entry| entry.token == entry.top_logprobs[0].token));
    }

    /// An echoed prompt's offsets: a character split over tokens is counted once.
    #[test]
    fn an_echoed_prompt_counts_characters_not_tokens() {
        let tokenizer = smollm2();
        let prompt = "Café ☕ naïve";
        let ids = tokenizer.encode(prompt, false).unwrap().ids;
        let now = std::time::Instant::now();
        let output = GenerationOutput {
            generated_text: "\n".into(),
            finish_reason: super::super::types::FinishReason::Length,
            generated_tokens: 1,
            seed: None,
            prefill: ids
                .iter()
                .enumerate()
                .map(|(i, &id)| PrefillToken {
                    id,
                    text: tokenizer.token_text(id),
                    logprob: (i > 0).then_some(-1.0),
                    special: false,
                    rank: (i > 0).then_some(1),
                })
                .collect(),
            prefill_top_tokens: vec![Vec::new(); ids.len() - 1],
            tokens: vec![token(&tokenizer, 198, "\n", -0.1)],
            top_tokens: vec![Vec::new()],
            input_length: ids.len() as u32,
            cached_tokens: 0,
            timings: Timings { arrival: now, validated: now, first_scheduled: now, finished: now },
        };
        let logprobs = choice_logprobs(&tokenizer, &output, Some(prompt), 0);
        let offsets: Vec<usize> = serde_json::from_value(logprobs["text_offset"].clone()).unwrap();
        let names: Vec<String> = serde_json::from_value(logprobs["tokens"].clone()).unwrap();
        assert_eq!(names.len(), ids.len() + 1);
        // Each whole token's name is the text at its offset; the generated token follows the prompt.
        let chars: Vec<char> = prompt.chars().collect();
        for (name, &offset) in names.iter().zip(&offsets).take(ids.len()) {
            if !name.starts_with("bytes:") {
                let at: String = chars[offset..offset + name.chars().count()].iter().collect();
                assert_eq!(&at, name);
            }
        }
        assert_eq!(offsets.last(), Some(&chars.len()));
    }

    /// The prompt's token among the alternatives is listed once, with its own rank; an impossible
    /// token's logprob is vLLM's -9999.0; only `top_n` alternatives are listed.
    #[test]
    fn vllm_prompt_logprobs_list_each_token_once() {
        let tokenizer = smollm2();
        let prefill = [
            PrefillToken { id: 5, text: String::new(), logprob: None, special: true, rank: None },
            PrefillToken { id: 7, text: String::new(), logprob: Some(-0.1), special: false, rank: Some(1) },
            PrefillToken { id: 8, text: String::new(), logprob: Some(f32::NEG_INFINITY), special: false, rank: Some(900) },
        ];
        let tops = vec![
            vec![token(&tokenizer, 7, "", -0.1), token(&tokenizer, 9, "", -2.5), token(&tokenizer, 10, "", -3.0)],
            vec![token(&tokenizer, 11, "", -0.2), token(&tokenizer, 12, "", -1.0), token(&tokenizer, 13, "", -3.0)],
        ];
        let positions = vllm_prompt_logprobs(&tokenizer, &prefill, &tops, 2);
        assert_eq!(positions.len(), 3);
        assert!(positions[0].is_none());
        let first = positions[1].as_ref().unwrap();
        assert_eq!(first.keys().collect::<Vec<_>>(), ["7", "9"]);
        assert_eq!(first["7"]["rank"], json!(1));
        assert_eq!(first["9"]["rank"], json!(2));
        let second = positions[2].as_ref().unwrap();
        assert_eq!(second.keys().collect::<Vec<_>>(), ["8", "11", "12"]);
        assert_eq!(second["8"], json!({"logprob": -9999.0, "rank": 900, "decoded_token": tokenizer.token_text(8)}));
    }
}
