//! A small OCI registry on 127.0.0.1 that answers as a test tells it,
//! hostile or not, and records what it received: requests (their first
//! line and headers) and how many body bytes it managed to send.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An answer.
pub enum Reply {
    /// A whole answer.
    Full { status: u16, headers: Vec<(String, String)>, body: Vec<u8> },
    /// A body that never ends (`Content-Length` as given, or none).
    Endless { content_length: Option<u64> },
    /// A body of `content_length` bytes, sent one byte every `every`.
    Trickle { content_length: u64, every: Duration },
}

impl Reply {
    /// A 200 with `body`.
    pub fn ok(body: Vec<u8>) -> Self {
        Self::Full { status: 200, headers: Vec::new(), body }
    }
}

/// The registry: its address and what it received.
pub struct TestRegistry {
    /// `127.0.0.1:port`.
    pub address: String,
    requests: Arc<Mutex<Vec<String>>>,
    sent: Arc<AtomicU64>,
}

/// What answers a request, given its head (first line and headers) and
/// its body.
pub type Handler = dyn Fn(&str, &[u8]) -> Reply + Send + Sync;

impl TestRegistry {
    /// Serves `handler`'s answer to each request (given its head) until
    /// the process ends.
    pub fn start(handler: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_with_bodies(move |head, _| handler(head))
    }

    /// Serves `handler`'s answer to each request (given its head and
    /// body) until the process ends.
    pub fn start_with_bodies(handler: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (requests, sent) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicU64::new(0)));
        let handler: Arc<Handler> = Arc::new(handler);
        let (accept_requests, accept_sent) = (requests.clone(), sent.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (handler, requests, sent) = (handler.clone(), accept_requests.clone(), accept_sent.clone());
                std::thread::spawn(move || serve(stream, &*handler, &requests, &sent));
            }
        });
        Self { address, requests, sent }
    }

    /// The heads of the requests received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// How many body bytes it has sent in all.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, handler: &Handler, requests: &Mutex<Vec<String>>, sent: &AtomicU64) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    requests.lock().unwrap().push(head.clone());
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
        .and_then(|length| length.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if std::io::Read::read_exact(&mut reader, &mut body).is_err() {
        return;
    }
    let mut stream = stream;
    let status_line = |status: u16| format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    match handler(&head, &body) {
        Reply::Full { status, headers, body } => {
            let mut text = status_line(status);
            for (name, value) in headers {
                text.push_str(&format!("{name}: {value}\r\n"));
            }
            text.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            let _ = stream.write_all(text.as_bytes()).and_then(|()| stream.write_all(&body));
            sent.fetch_add(body.len() as u64, Ordering::SeqCst);
        }
        Reply::Endless { content_length } => {
            let length = content_length.map(|length| format!("Content-Length: {length}\r\n")).unwrap_or_default();
            let _ = stream.write_all(format!("{}{length}\r\n", status_line(200)).as_bytes());
            let chunk = vec![b' '; 64 << 10];
            while stream.write_all(&chunk).is_ok() {
                sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            }
        }
        Reply::Trickle { content_length, every } => {
            let _ =
                stream.write_all(format!("{}Content-Length: {content_length}\r\n\r\n", status_line(200)).as_bytes());
            for _ in 0..content_length {
                std::thread::sleep(every);
                if stream.write_all(b" ").and_then(|()| stream.flush()).is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// The manifest of a Wasm OCI artifact whose one layer is `layer`.
pub fn wasm_manifest(layer: &[u8]) -> Vec<u8> {
    let config = b"{}";
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.wasm.config.v0+json",
            "digest": wakuwaku::operations::oci::sha256_digest(config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/wasm",
            "digest": wakuwaku::operations::oci::sha256_digest(layer),
            "size": layer.len(),
        }],
    })
    .to_string()
    .into_bytes()
}

/// Serves `layer` as the one artifact of every repository and tag.
pub fn serving(layer: Vec<u8>) -> TestRegistry {
    let manifest = wasm_manifest(&layer);
    TestRegistry::start(move |head| {
        if head.contains("/manifests/") {
            Reply::ok(manifest.clone())
        } else if head.contains("/blobs/") {
            Reply::ok(layer.clone())
        } else {
            Reply::Full { status: 404, headers: Vec::new(), body: Vec::new() }
        }
    })
}

/// A registry that keeps what is pushed to it, in memory, and serves it
/// back: blobs by digest, manifests by tag.
pub fn storing() -> TestRegistry {
    let kept: Mutex<std::collections::HashMap<String, Vec<u8>>> = Mutex::default();
    TestRegistry::start_with_bodies(move |head, body| {
        let first = head.lines().next().unwrap_or_default();
        let mut words = first.split(' ');
        let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        let empty = |status| Reply::Full { status, headers: Vec::new(), body: Vec::new() };
        let mut kept = kept.lock().unwrap();
        match method {
            "POST" if path.ends_with("/blobs/uploads/") => Reply::Full {
                status: 202,
                headers: vec![("Location".into(), format!("{path}upload-1"))],
                body: Vec::new(),
            },
            "PUT" if path.contains("/blobs/uploads/") => {
                let digest = query.split('&').find_map(|pair| pair.strip_prefix("digest=")).unwrap_or_default();
                kept.insert(digest.replace("%3A", ":"), body.to_vec());
                empty(201)
            }
            "PUT" if path.contains("/manifests/") => {
                // By tag and by digest, as a registry finds it.
                let (repository, _) = path.rsplit_once('/').unwrap_or_default();
                kept.insert(format!("{repository}/{}", wakuwaku::operations::oci::sha256_digest(body)), body.to_vec());
                kept.insert(path.to_owned(), body.to_vec());
                empty(201)
            }
            "HEAD" | "GET" => {
                let key = path.rsplit_once("/blobs/").map_or(path.to_owned(), |(_, digest)| digest.to_owned());
                match kept.get(&key) {
                    Some(bytes) if method == "GET" => Reply::ok(bytes.clone()),
                    Some(_) => empty(200),
                    None => empty(404),
                }
            }
            _ => empty(405),
        }
    })
}
