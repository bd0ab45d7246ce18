//! Helpers shared by the integration tests that need no database.

use std::io::Read;
use std::net::TcpListener;

/// A "database server" that accepts every connection, reads what the
/// client sends and answers nothing (a proxy with no backend behind it, a
/// stopped server). Returns its port.
pub fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = stream;
                let mut buf = [0u8; 1024];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    port
}
