//! Stop sequences, matched on the decoded text as it grows. A match ends the generation with
//! `stop_sequence`. TGI's routes keep the stop sequence and end the text right after it (TGI
//! keeps it, and its matcher only fires when the output ends with the sequence); OpenAI's
//! leave it out (`trim`), as OpenAI and vLLM do, unless `include_stop_str_in_output`. A stream
//! that leaves it out holds back text that may be the start of one (`held_back`), so no
//! piece of a stop sequence is ever sent.

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    sequences: Vec<String>,
    longest: usize,
    /// Cut the text before a match instead of after it.
    trim: bool,
}

impl StopMatcher {
    pub fn new(sequences: &[String]) -> Self {
        let sequences: Vec<String> = sequences
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        let longest = sequences.iter().map(String::len).max().unwrap_or(0);
        Self { sequences, longest, trim: false }
    }

    /// Leaves matched stop sequences out of the text.
    pub fn trimming(self, trim: bool) -> Self {
        Self { trim, ..self }
    }

    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// `text` is the whole generated text, of which bytes from `new_from` on arrived last.
    /// Returns the length the text must be cut to when a stop sequence now occurs in it: the
    /// end of the earliest match that overlaps the new text (earlier text was checked before),
    /// or its start when trimming.
    pub fn find(&self, text: &str, new_from: usize) -> Option<usize> {
        let (start, end) = self.find_match(text, new_from)?;
        Some(if self.trim { start } else { end })
    }

    /// How many bytes at the end of `text` must not be sent yet: the longest end of it that a
    /// stop sequence starts with (0 unless trimming).
    pub fn held_back(&self, text: &str) -> usize {
        if !self.trim {
            return 0;
        }
        let bytes = text.as_bytes();
        (1..self.longest.min(bytes.len() + 1))
            .rev()
            .find(|&length| {
                let start = bytes.len() - length;
                text.is_char_boundary(start)
                    && self.sequences.iter().any(|sequence| sequence.len() > length && sequence.as_bytes().starts_with(&bytes[start..]))
            })
            .unwrap_or(0)
    }

    /// The earliest match overlapping the new text: its start and end.
    fn find_match(&self, text: &str, new_from: usize) -> Option<(usize, usize)> {
        if self.is_empty() || new_from >= text.len() {
            return None;
        }
        let mut window_start = new_from.saturating_sub(self.longest.saturating_sub(1));
        while !text.is_char_boundary(window_start) {
            window_start -= 1;
        }
        let window = &text[window_start..];
        self.sequences
            .iter()
            .filter_map(|sequence| {
                window
                    .match_indices(sequence.as_str())
                    .map(|(start, matched)| (window_start + start, window_start + start + matched.len()))
                    .find(|&(_, end)| end > new_from)
            })
            .min_by_key(|&(_, end)| end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(sequences: &[&str]) -> StopMatcher {
        StopMatcher::new(&sequences.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// Feeds pieces one by one; returns the text as cut at the first match, and whether one hit.
    fn run(matcher: &StopMatcher, pieces: &[&str]) -> (String, bool) {
        let mut text = String::new();
        for piece in pieces {
            let new_from = text.len();
            text.push_str(piece);
            if let Some(end) = matcher.find(&text, new_from) {
                text.truncate(end);
                return (text, true);
            }
        }
        (text, false)
    }

    /// OpenAI's reading: the text ends before the stop sequence, and what is sent as it grows
    /// never holds a piece of one (a possible start waits until it cannot be one).
    #[test]
    fn trimming_cuts_before_the_sequence_and_sends_none_of_it() {
        let stop = matcher(&["\n\n", "END"]).trimming(true);
        assert_eq!(run(&stop, &["Hello", " world.\n", "\nNext"]), ("Hello world.".into(), true));
        assert_eq!(run(&stop, &["abc E", "N", "D"]), ("abc ".into(), true));
        assert_eq!(stop.held_back("abc E"), 1);
        assert_eq!(stop.held_back("abc EN"), 2);
        assert_eq!(stop.held_back("abc ENX"), 0);
        assert_eq!(stop.held_back("line\n"), 1);
        assert_eq!(stop.held_back("日本"), 0);
        assert_eq!(matcher(&["本語"]).trimming(true).held_back("日本"), 3);
        // Without trimming nothing is held back.
        assert_eq!(matcher(&["END"]).held_back("abc E"), 0);
    }

    #[test]
    fn match_inside_one_piece_cuts_after_the_sequence() {
        let stop = matcher(&["\n\n"]);
        assert_eq!(
            run(&stop, &["Hello", " world.\n\nNext", " part"]),
            ("Hello world.\n\n".into(), true)
        );
    }

    #[test]
    fn match_spanning_pieces_is_found() {
        let stop = matcher(&["END"]);
        assert_eq!(
            run(&stop, &["abc E", "N", "D and more"]),
            ("abc END".into(), true)
        );
    }

    #[test]
    fn earliest_of_several_sequences_wins() {
        let stop = matcher(&["world", "lo"]);
        assert_eq!(run(&stop, &["hello world"]), ("hello".into(), true));
    }

    #[test]
    fn no_match_keeps_everything() {
        let stop = matcher(&["zzz"]);
        assert_eq!(run(&stop, &["a", "b", "zz"]), ("abzz".into(), false));
        assert_eq!(run(&matcher(&[]), &["zzz"]), ("zzz".into(), false));
        assert_eq!(run(&matcher(&[""]), &["zzz"]), ("zzz".into(), false));
    }

    #[test]
    fn multi_byte_text_and_sequences() {
        let stop = matcher(&["日本"]);
        assert_eq!(
            run(&stop, &["héllo 日", "本語"]),
            ("héllo 日本".into(), true)
        );
        let stop = matcher(&["ab"]);
        assert_eq!(run(&stop, &["🤗a", "b🤗"]), ("🤗ab".into(), true));
    }
}
