//! The server's tokenizer over a real Hugging Face tokenizer file (the test fixture).

use std::path::PathBuf;

use mocker_server::tokenizer::Tokenizer;

fn fixture() -> Tokenizer {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/all-minilm-l6-v2");
    Tokenizer::from_path(&dir).expect("fixture tokenizer loads")
}

#[test]
fn encodes_without_padding_and_output_tokens_round_trip() {
    let t = fixture();
    let ids = t.encode("hello world, tokenization works", true).unwrap();
    // [CLS] ... [SEP]: the file pads to 128, which must be switched off.
    assert!(ids.len() > 4 && ids.len() < 20, "{ids:?}");
    let body = &ids[1..ids.len() - 1];
    let whole = t.decode(body).unwrap();
    assert_eq!(whole, "hello world, tokenization works");
    // Output is drawn from pool entries whose streamed texts re-encode to their ids.
    let pool = t.output_vocab();
    let picks = [3usize, 0, 3, pool.len() - 1, 42];
    let streamed: String = picks.iter().map(|&i| pool.text(i)).collect();
    let ids: Vec<u32> = picks.iter().map(|&i| pool.id(i)).collect();
    assert_eq!(t.encode(&streamed, false).unwrap(), ids);
    assert_eq!(t.decode(&ids).unwrap(), streamed.trim_start());
}

#[test]
fn out_of_vocabulary_ids_wrap_instead_of_failing() {
    let t = fixture();
    let big = t.vocab_size() + 1037;
    assert_eq!(t.decode(&[big]).unwrap(), t.decode(&[1037]).unwrap());
}

#[test]
fn a_missing_file_names_the_path() {
    let err = Tokenizer::from_path(std::path::Path::new("/nonexistent/tok.json")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/tok.json"), "{err}");
}

/// `/dev/zero` would be read forever: it is refused at once as not a regular file.
#[cfg(unix)]
#[test]
fn devices_and_pipes_are_refused_without_reading() {
    let err = Tokenizer::from_path(std::path::Path::new("/dev/zero")).unwrap_err().to_string();
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
}

/// A file above the size limit is refused from its size, before any parsing.
#[test]
fn oversized_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("mocker-tokenizer-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    let f = std::fs::File::create(&path).unwrap();
    // Sparse: no disk space is used.
    f.set_len(mocker_server::tokenizer::MAX_TOKENIZER_BYTES + 1).unwrap();
    let err = Tokenizer::from_path(&dir).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.contains("limit"), "{err}");
}
