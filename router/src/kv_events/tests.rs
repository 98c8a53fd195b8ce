//! The publisher over real sockets: live batches with their sequence numbers, and the replay
//! of what a late subscriber missed.
use std::time::Duration;

use superinfer_scheduler::KvCacheEvent;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::{start_publisher, KvEventsConfig};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn removed(hash: u64) -> Vec<KvCacheEvent> {
    vec![KvCacheEvent::Removed { block_hashes: vec![hash] }]
}

fn seq(frame: &[u8]) -> i64 {
    i64::from_be_bytes(frame.try_into().unwrap())
}

#[tokio::test]
async fn batches_are_published_in_sequence_and_replayed_from_the_buffer() {
    let (live_port, replay_port) = (free_port(), free_port());
    let json = format!(
        r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://*:{live_port}",
            "replay_endpoint":"tcp://127.0.0.1:{replay_port}","topic":"kv","buffer_steps":2}}"#
    );
    let config = KvEventsConfig::parse(&json).unwrap();
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let sink = start_publisher(&config, 4, Default::default(), &tracker, shutdown.clone()).await.unwrap();

    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{live_port}")).await.unwrap();
    sub.subscribe("kv").await.unwrap();
    // A subscription takes effect asynchronously: publish until one arrives.
    let mut published = 0;
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            sink.publish(removed(1));
            published += 1;
            if let Ok(Ok(message)) = tokio::time::timeout(Duration::from_millis(50), sub.recv()).await {
                return message.into_vec();
            }
        }
    })
    .await
    .expect("a batch arrives");
    assert_eq!(first.len(), 3);
    assert_eq!(first[0].as_ref(), b"kv");
    let mut previous = seq(&first[1]);
    sink.publish(removed(2));
    let last = published;
    let next = loop {
        let message = sub.recv().await.unwrap().into_vec();
        assert_eq!(seq(&message[1]), previous + 1, "consecutive batches, consecutive numbers");
        previous += 1;
        if previous == last {
            break message;
        }
    };

    // Ask for everything from 0: only the last two batches are still buffered.
    let mut dealer = DealerSocket::new();
    dealer.connect(&format!("tcp://127.0.0.1:{replay_port}")).await.unwrap();
    let request = ZmqMessage::try_from(vec![bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&0i64.to_be_bytes())]).unwrap();
    dealer.send(request).await.unwrap();
    let mut replayed = Vec::new();
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(10), dealer.recv()).await.unwrap().unwrap().into_vec();
        assert_eq!(answer.len(), 4, "[b\"\", topic, seq, payload]");
        assert!(answer[0].is_empty());
        if seq(&answer[2]) == -1 {
            assert!(answer[1].is_empty() && answer[3].is_empty(), "the end marker carries no topic or payload");
            break;
        }
        assert_eq!(answer[1].as_ref(), b"kv");
        replayed.push((seq(&answer[2]), answer[3].clone()));
    }
    assert_eq!(replayed.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), [last - 1, last]);
    assert_eq!(replayed[1].1, next[2], "the replayed payload is the one published");
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
}
