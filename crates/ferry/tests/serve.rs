//! `ferry serve`, the lab pods' test servers, on loopback: every HTTP path and the UDP
//! echo, including a datagram that IP fragments on any link.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command};
use std::thread::sleep;
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(port: u16, path: &str) -> (String, Vec<u8>) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut all = Vec::new();
    c.read_to_end(&mut all).unwrap();
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    (head, all[split + 4..].to_vec())
}

#[test]
fn http_paths_and_udp_echo_answer_as_documented() {
    let (http, udp) = (free_port(), free_port());
    let _s = Server(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["serve", "--name", "web-1", "--http-port"])
            .arg(http.to_string())
            .arg("--udp-port")
            .arg(udp.to_string())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(Instant::now() < deadline, "the server did not start");
        sleep(Duration::from_millis(20));
    }
    assert_eq!(get(http, "/hostname").1, b"web-1");
    assert_eq!(get(http, "/clientip").1, b"127.0.0.1");
    assert_eq!(get(http, "/echo?msg=hello+there%21").1, b"hello there!");
    let (head, body) = get(http, "/bytes?n=3000000");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body.len(), 3_000_000);
    assert!(
        body.iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 65536 % 251) as u8)
    );
    assert!(head.contains("\r\nX-Served-By: web-1"), "{head}");
    // Paced: 300 000 bytes at 1 MB/s last about 0.3 s, in the same pattern.
    let t = Instant::now();
    let (head, paced) = get(http, "/bytes?n=300000&rate=1000000");
    let took = t.elapsed();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(paced[..], body[..300_000]);
    assert!(
        took >= Duration::from_millis(280) && took < Duration::from_secs(3),
        "300 000 bytes at 1 MB/s took {took:?}"
    );
    assert!(get(http, "/nope").0.starts_with("HTTP/1.1 404"));
    assert!(get(http, "/bytes?n=x").0.starts_with("HTTP/1.1 400"));
    assert!(get(http, "/bytes?n=5&rate=0").0.starts_with("HTTP/1.1 400"));

    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    u.connect(("127.0.0.1", udp)).unwrap();
    let mut buf = vec![0u8; 65536];
    let big: Vec<u8> = (0..16000u32).map(|i| (i * 7) as u8).collect();
    u.send(&big).unwrap();
    let n = u.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &big[..]);
    u.send(b"hostname").unwrap();
    let n = u.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"web-1");
    u.send(b"clientip").unwrap();
    let n = u.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"127.0.0.1");
}
