//! Stop sequences, matched on the decoded text as it grows. A match ends the generation with
//! `stop_sequence`; the text keeps the stop sequence and ends right after it (TGI keeps it,
//! and its matcher only fires when the output ends with the sequence).

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    sequences: Vec<String>,
    longest: usize,
}

impl StopMatcher {
    pub fn new(sequences: &[String]) -> Self {
        let sequences: Vec<String> = sequences
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        let longest = sequences.iter().map(String::len).max().unwrap_or(0);
        Self { sequences, longest }
    }

    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// `text` is the whole generated text, of which bytes from `new_from` on arrived last.
    /// Returns the length the text must be cut to when a stop sequence now occurs in it: the
    /// end of the earliest match that overlaps the new text (earlier text was checked before).
    pub fn find(&self, text: &str, new_from: usize) -> Option<usize> {
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
                    .map(|(start, matched)| window_start + start + matched.len())
                    .find(|&end| end > new_from)
            })
            .min()
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
