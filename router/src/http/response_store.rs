//! The responses this server keeps for OpenAI's Responses API (`store`, on by default as at
//! OpenAI): a later request continues one by `previous_response_id`, and `GET` and `DELETE
//! /v1/responses/{id}` read and remove it. Each is kept with its conversation — the items of
//! the responses it continues, its own input items and its output items — so a continuation is
//! that conversation followed by the new input (the previous `instructions` are not carried
//! over, as at OpenAI). In memory, within `--responses-store-bytes` (the JSON's size): the
//! oldest go first, and a restart forgets them all; each replica keeps its own.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// `--responses-store-bytes`'s default: 64 MiB.
pub const DEFAULT_STORE_BYTES: usize = 64 << 20;

/// One kept response.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    /// The response object as it was returned.
    pub response: Value,
    /// The conversation it ends: the input items of every response it continues and of its own,
    /// with each one's output items after its input.
    pub items: Arc<Vec<Value>>,
}

#[derive(Debug, Default)]
struct Kept {
    by_id: HashMap<String, (StoredResponse, usize)>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// Kept responses by id, within a byte budget.
#[derive(Debug, Default)]
pub struct ResponseStore {
    max_bytes: usize,
    kept: Mutex<Kept>,
}

impl ResponseStore {
    /// A store of at most `max_bytes` (0: none is kept).
    pub fn new(max_bytes: usize) -> Self {
        ResponseStore { max_bytes, kept: Mutex::default() }
    }

    /// Whether responses are kept at all.
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The response `id`, if kept.
    pub fn get(&self, id: &str) -> Option<StoredResponse> {
        self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).by_id.get(id).map(|(stored, _)| stored.clone())
    }

    /// Keeps `response` (its `id` names it) with the conversation it ends; the oldest go until it
    /// fits. One larger than the whole budget is not kept.
    pub fn put(&self, response: Value, items: Vec<Value>) {
        let Some(id) = response["id"].as_str().map(String::from) else { return };
        let bytes = serde_json::to_vec(&response).map_or(0, |json| json.len())
            + items.iter().map(|item| serde_json::to_vec(item).map_or(0, |json| json.len())).sum::<usize>();
        if bytes > self.max_bytes {
            tracing::debug!(%id, bytes, "a response larger than --responses-store-bytes is not kept");
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while kept.bytes + bytes > self.max_bytes {
            let Some(oldest) = kept.order.pop_front() else { break };
            if let Some((_, size)) = kept.by_id.remove(&oldest) {
                kept.bytes -= size;
            }
        }
        kept.bytes += bytes;
        kept.order.push_back(id.clone());
        if let Some((_, size)) = kept.by_id.insert(id, (StoredResponse { response, items: Arc::new(items) }, bytes)) {
            kept.bytes -= size;
        }
    }

    /// Removes the response `id`; whether it was kept.
    pub fn delete(&self, id: &str) -> bool {
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some((_, size)) = kept.by_id.remove(id) else { return false };
        kept.bytes -= size;
        kept.order.retain(|kept_id| kept_id != id);
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn response(id: &str, text: &str) -> Value {
        json!({"id": id, "object": "response", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]})
    }

    fn size(response: &Value, items: &[Value]) -> usize {
        serde_json::to_vec(response).unwrap().len() + items.iter().map(|item| serde_json::to_vec(item).unwrap().len()).sum::<usize>()
    }

    /// Kept until the budget needs their room, oldest first; deleted ones free theirs at once;
    /// one larger than the budget is not kept; a budget of 0 keeps none.
    #[test]
    fn the_oldest_go_first_within_the_budget() {
        let items = vec![json!({"role": "user", "content": "Hi"})];
        let one = size(&response("resp_1", "Hello"), &items);
        let store = ResponseStore::new(2 * one + one / 2);
        store.put(response("resp_1", "Hello"), items.clone());
        store.put(response("resp_2", "Hello"), items.clone());
        assert_eq!(store.get("resp_1").unwrap().items.as_slice(), items.as_slice());
        store.put(response("resp_3", "Hello"), items.clone());
        assert!(store.get("resp_1").is_none() && store.get("resp_2").is_some() && store.get("resp_3").is_some());
        assert!(store.delete("resp_2") && !store.delete("resp_2"));
        assert_eq!(store.kept.lock().unwrap().order, ["resp_3"], "a deleted id leaves the order too");
        store.put(response("resp_4", "Hello"), items.clone());
        assert!(store.get("resp_3").is_some() && store.get("resp_4").is_some());
        store.put(response("resp_5", &"long ".repeat(one)), items.clone());
        assert!(store.get("resp_5").is_none() && store.get("resp_4").is_some(), "too large for the budget: not kept, nothing evicted");
        let off = ResponseStore::new(0);
        off.put(response("resp_1", "Hello"), items);
        assert!(!off.enabled() && off.get("resp_1").is_none());
    }
}
