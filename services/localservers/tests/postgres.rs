//! A port picked as free can be taken before PostgreSQL binds it (another
//! test's server, or a connection's local port): starting must not hang on
//! it nor mistake the other listener for the server.

use localservers::{PgOptions, Postgres};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[test]
fn a_restart_waits_for_its_port_to_be_released_and_answers_on_it() {
    let mut pg = Postgres::start_temporary(PgOptions::default()).expect("postgres");
    let port = pg.port();
    pg.stop();
    // Someone else listens on the port while the server is down...
    let squatter = TcpListener::bind(("127.0.0.1", port)).expect("take the port");
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        drop(squatter);
    });
    // ...so the restart fails to bind, notices, and tries again once it is free.
    let started = std::time::Instant::now();
    pg.restart().expect("restart once the port is free");
    release.join().expect("release");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "it could not have bound the port before it was released"
    );
    assert_eq!(pg.port(), port, "a restart keeps its port");
    // The server itself answers there (its log says it is ready; its
    // socket accepts).
    TcpStream::connect(("127.0.0.1", port)).expect("postgres listens on its port");
    let log = std::fs::read_to_string(pg.log()).expect("log");
    assert!(log.contains("could not create any TCP/IP sockets"), "{log}");
    assert!(
        log.matches("database system is ready to accept connections")
            .count()
            >= 2,
        "{log}"
    );
}
