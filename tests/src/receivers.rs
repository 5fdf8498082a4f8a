//! Receivers the agent's tests send to: a Pyroscope-like HTTP endpoint whose behaviour a
//! test scripts (accept, refuse with a status, hang, reset the connection), and the OTLP
//! receiver (tests/py/otlp_receiver.py, the OpenTelemetry project's own protobuf classes
//! and grpcio, from the venv `cargo xtask setup` makes).

use std::{
    collections::VecDeque,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// What the HTTP endpoint does with the next request.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// 200, request kept.
    Accept,
    /// This status, request not kept.
    Refuse(u16),
    /// Read it, never answer (until the client gives up).
    Hang,
    /// Read it, then reset the connection.
    Reset,
}

/// One request received.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its path.
    pub path: String,
    /// Its headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
    /// What was done with it.
    pub behaviour: String,
    /// When it arrived.
    pub at: Instant,
}

/// An HTTP/1.1 endpoint on 127.0.0.1 that plays a script of behaviours, then accepts.
pub struct HttpEndpoint {
    /// Its port.
    pub port: u16,
    /// Every request seen, whatever was done with it.
    pub seen: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<Behaviour>>>,
}

impl HttpEndpoint {
    /// Starts one playing `script` first.
    pub fn start(script: &[Behaviour]) -> HttpEndpoint {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let (s, q) = (seen.clone(), script.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, q) = (s.clone(), q.clone());
                std::thread::spawn(move || serve(stream, &s, &q));
            }
        });
        HttpEndpoint { port, seen, script }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Adds behaviours to play.
    pub fn then(&self, more: &[Behaviour]) {
        self.script.lock().unwrap().extend(more.iter().copied());
    }

    /// The bodies of the accepted requests.
    pub fn accepted(&self) -> Vec<Received> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|r| r.behaviour == "Accept")
            .cloned()
            .collect()
    }
}

fn serve(stream: TcpStream, seen: &Mutex<Vec<Received>>, script: &Mutex<VecDeque<Behaviour>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_owned();
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let behaviour = script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Behaviour::Accept);
        seen.lock().unwrap().push(Received {
            path,
            headers,
            body,
            behaviour: format!("{behaviour:?}")
                .split('(')
                .next()
                .unwrap()
                .to_owned(),
            at: Instant::now(),
        });
        match behaviour {
            Behaviour::Accept => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
            }
            Behaviour::Refuse(status) => {
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} Nope\r\nContent-Length: 7\r\n\r\nrefused"
                );
            }
            Behaviour::Hang => {
                std::thread::sleep(Duration::from_secs(60));
                return;
            }
            Behaviour::Reset => {
                // SO_LINGER 0: close sends RST.
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                use std::os::fd::AsRawFd as _;
                // SAFETY: setsockopt on our own socket with a valid linger struct.
                unsafe {
                    libc::setsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        (&raw const linger).cast(),
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                return;
            }
        }
    }
}

/// The OTLP receiver process (killed on drop) and the file it writes.
pub struct OtlpReceiver {
    child: Child,
    /// Its gRPC port.
    pub grpc_port: u16,
    /// Its HTTP port.
    pub http_port: u16,
    /// Its JSON lines.
    pub out: PathBuf,
}

impl OtlpReceiver {
    /// Starts it, writing into `out`.
    pub fn start(out: PathBuf) -> OtlpReceiver {
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
        let python = PathBuf::from(home).join(".cache/allocscope-py-tools/bin/python");
        assert!(
            python.exists(),
            "{} missing: run `cargo xtask setup` (it installs the OTLP receiver's packages)",
            python.display()
        );
        let (child, line) = crate::spawn_with_first_line(
            Command::new(python)
                .arg(crate::workspace().join("tests/py/otlp_receiver.py"))
                .arg("--out")
                .arg(&out),
        );
        let ports: Vec<u16> = line
            .strip_prefix("ports ")
            .unwrap_or_else(|| panic!("the receiver said {line:?}"))
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        OtlpReceiver {
            child,
            grpc_port: ports[0],
            http_port: ports[1],
            out,
        }
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
