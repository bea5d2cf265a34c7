//! A streamed completion over real HTTP: a reader that falls far behind the engine still
//! gets every token, in order, then `[DONE]`.

use std::time::Duration;

use futures_util::StreamExt;
use mocker_core::config::LaunchConfig;
use mocker_server::{BoundServer, ServerOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_far_behind_gets_every_token_once_in_order() {
    let tokens = 4000;
    let launch = LaunchConfig::from_json_str(r#"{"speedup_ratio": 1000000}"#).unwrap();
    let server = BoundServer::bind(ServerOptions::new("127.0.0.1:0".parse().unwrap(), launch), Vec::new())
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve(std::future::pending()));
    let body = serde_json::json!({"prompt": [1, 2, 3], "max_tokens": tokens, "stream": true});
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    // Let the whole response pile up before reading: chunks then hold many frames each.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut text = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(text).unwrap();
    let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert_eq!(frames.last(), Some(&"data: [DONE]"));
    let chunks: Vec<serde_json::Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks.len(), tokens);
    let words: Vec<&str> = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    // One built-in word per token, space first: the text re-tokenizes to the count.
    assert!(
        words.iter().all(|w| w.starts_with(' ') && w[1..].bytes().all(|b| b.is_ascii_lowercase())),
        "{words:?}"
    );
    let whole: String = words.concat();
    assert_eq!(mocker_server::Tokenizer::Builtin.encode(&whole, false).unwrap().len(), tokens);
    let reasons: Vec<&serde_json::Value> = chunks.iter().map(|c| &c["choices"][0]["finish_reason"]).collect();
    assert!(reasons[..tokens - 1].iter().all(|r| r.is_null()));
    assert_eq!(reasons[tokens - 1], "length");
}

/// A reader with a tiny receive window: the server's writes stall, the engine runs far
/// ahead, and every chunk the server writes is a full batch of frames. No frame is lost
/// at a batch's edge, for any of the `n` choices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_of_n_choices_loses_no_frame_at_batch_edges() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // About 6 MB of frames: more than the server's socket send buffer grows to (4 MiB).
    let (tokens, n) = (5000usize, 8usize);
    let launch = LaunchConfig::from_json_str(r#"{"speedup_ratio": 1000000}"#).unwrap();
    let server = BoundServer::bind(ServerOptions::new("127.0.0.1:0".parse().unwrap(), launch), Vec::new())
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve(std::future::pending()));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    let body =
        serde_json::json!({"prompt": [1, 2, 3], "max_tokens": tokens, "n": n, "stream": true}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let mut counts = vec![0usize; n];
    let mut done = false;
    for frame in raw.split("\n\n") {
        let Some(at) = frame.find("data: ") else { continue };
        let data = &frame[at + 6..];
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        counts[v["choices"][0]["index"].as_u64().unwrap() as usize] += 1;
    }
    assert!(done);
    assert_eq!(counts, vec![tokens; n]);
}
