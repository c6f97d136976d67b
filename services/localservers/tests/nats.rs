//! A port picked as free can be taken before nats-server binds it: a
//! restart must wait for its port, not hang nor mistake the other listener
//! for the server.

use localservers::Nats;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[test]
fn a_restart_waits_for_its_port_to_be_released_and_the_server_answers_on_it() {
    let mut nats = Nats::start_temporary().expect("nats-server");
    let url = nats.url();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port in url");
    nats.stop();
    let squatter = TcpListener::bind(("127.0.0.1", port)).expect("take the port");
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        drop(squatter);
    });
    let started = std::time::Instant::now();
    nats.restart().expect("restart once the port is free");
    release.join().expect("release");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(nats.url(), url, "a restart keeps its port");
    // nats-server itself answers there: its greeting is an INFO line.
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut greeting = [0u8; 4];
    c.read_exact(&mut greeting).expect("greeting");
    assert_eq!(&greeting, b"INFO");
}
