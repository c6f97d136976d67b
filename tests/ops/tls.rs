//! TLS on the way to PostgreSQL and to the PSP, against real servers: a
//! PostgreSQL that takes TLS connections only (`hostssl` alone in its
//! `pg_hba.conf`, `ssl=on`, a certificate from a CA made for the test with
//! `openssl`), and psp-sim behind a TLS terminator (`socat`) with a
//! certificate from the same CA. Every service runs on `verify-full`; a
//! connection in clear, or to a server the CA did not sign, is refused in
//! one line that names `DATABASE_URL`.

use localservers::{free_port, PgOptions, Postgres};
use soldonce_tests::eventually;
use soldonce_tests::relay::soldonce;
use soldonce_tests::saga::psp_listing;
use soldonce_tests::system::{System, SystemOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian: openssl) runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_pki(dir: &Path, name: &str) -> Pki {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).expect("pki dir");
    let subject = format!("/CN=soldonce test CA {name}");
    openssl(
        &dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", &subject,
        ],
    );
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("extensions");
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    }
}

/// Lets the user PostgreSQL runs as (a non-root one, when the tests run as
/// root) read `path`, and reach it; the key must be its own and private.
fn hand_to_server_user(root: &Path, pki: &Pki) {
    use std::os::unix::fs::PermissionsExt;
    let mut dir = pki.key.parent().expect("a folder").to_path_buf();
    while dir.starts_with(root) {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        if !dir.pop() {
            break;
        }
    }
    let as_root = Command::new("id").arg("-u").output().expect("id").stdout == b"0\n";
    if as_root {
        let user = std::env::var("SOLDONCE_PG_USER").unwrap_or_else(|_| "postgres".into());
        for f in [&pki.cert, &pki.key] {
            let ok = Command::new("chown")
                .arg(&user)
                .arg(f)
                .status()
                .expect("chown");
            assert!(ok.success(), "chown {user} {}", f.display());
        }
    }
    std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
}

/// A PostgreSQL that refuses every connection not made over TLS.
fn tls_only_postgres(root: &Path, pki: &Pki) -> Postgres {
    hand_to_server_user(root, pki);
    let hba = root.join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
    )
    .expect("hba");
    Postgres::start_in(
        &root.join("pg"),
        PgOptions {
            settings: vec![
                "ssl=on".into(),
                format!("ssl_cert_file={}", pki.cert.display()),
                format!("ssl_key_file={}", pki.key.display()),
                format!("hba_file={}", hba.display()),
            ],
            ..PgOptions::default()
        },
    )
    .expect("a TLS-only postgres")
}

fn url(pg: &Postgres, query: &str) -> String {
    format!(
        "postgres://postgres@localhost:{}/postgres?{query}",
        pg.port()
    )
}

/// The one line of `text` that names `DATABASE_URL`.
fn the_line(text: &str) -> &str {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("DATABASE_URL"))
        .collect();
    assert_eq!(lines.len(), 1, "one line names DATABASE_URL: {text}");
    lines[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_runs_on_a_tls_only_postgres_with_verify_full_and_pays_through_an_https_psp()
{
    let temp = tempfile::tempdir().expect("temp dir");
    let root = temp.path();
    let pki = make_pki(root, "shop");
    let stranger = make_pki(root, "stranger");
    let pg = tls_only_postgres(root, &pki);
    let verified = url(
        &pg,
        &format!("sslmode=verify-full&sslrootcert={}", pki.ca.display()),
    );

    // Refused, each in one line naming the variable, and nothing migrated.
    let (code, text) = soldonce(
        &["migrate"],
        &[("DATABASE_URL", &url(&pg, "sslmode=disable"))],
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(
        the_line(&text).contains("refuses connections without TLS"),
        "{text}"
    );
    let wrong_ca = url(
        &pg,
        &format!("sslmode=verify-full&sslrootcert={}", stranger.ca.display()),
    );
    let (code, text) = soldonce(&["migrate"], &[("DATABASE_URL", &wrong_ca)]);
    assert_ne!(code, Some(0), "{text}");
    assert!(
        the_line(&text).contains("TLS connection to the database failed"),
        "{text}"
    );
    let (code, text) = soldonce(
        &["migrate"],
        &[("DATABASE_URL", &url(&pg, "sslmode=verify-fuII"))],
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(
        the_line(&text).contains("sslmode=verify-fuII is not one of"),
        "{text}"
    );
    let (code, text) = soldonce(
        &["migrate"],
        &[(
            "DATABASE_URL",
            &url(&pg, "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"),
        )],
    );
    assert_ne!(code, Some(0), "{text}");
    assert!(the_line(&text).contains("no such file"), "{text}");

    let (code, text) = soldonce(&["migrate"], &[("DATABASE_URL", &verified)]);
    assert_eq!(code, Some(0), "migrate over verify-full: {text}");

    // psp-sim behind TLS: the payment worker knows it only as https://localhost.
    let psp_port = free_port().expect("port");
    let tls_port = free_port().expect("port");
    let _terminator = tokio::process::Command::new("socat")
        .arg(format!(
            "OPENSSL-LISTEN:{tls_port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},verify=0",
            pki.cert.display(),
            pki.key.display()
        ))
        .arg(format!("TCP:127.0.0.1:{psp_port}"))
        .kill_on_drop(true)
        .spawn()
        .expect("socat (Debian: socat) runs");
    let system = System::start_with(SystemOptions {
        database_url: Some(verified.clone()),
        ports: vec![("psp-sim", psp_port)],
        env: vec![
            (
                "payment-worker",
                "PSP_URL",
                format!("https://localhost:{tls_port}"),
            ),
            (
                "payment-worker",
                "SSL_CERT_FILE",
                pki.ca.display().to_string(),
            ),
        ],
        ..SystemOptions::default()
    })
    .await;
    system.app.add_product("LAMP", 2_500, 5).await;
    let placed = system
        .place("checkout", &system.app.token, "tls-1", "LAMP")
        .await;
    assert_eq!(placed.status, 202, "{}", placed.body);
    let id = placed.body["id"].as_str().expect("an order id").to_owned();
    let order = eventually(
        "the order confirmed and delivered",
        Duration::from_secs(60),
        || async {
            let r = system
                .app
                .get(&system.app.token, &format!("/v1/orders/{id}"))
                .await;
            // Delivered, and its authorization captured.
            (r.body["state"] == "confirmed"
                && r.body["shipment"]["state"] == "delivered"
                && r.body["payment"]["state"] == "succeeded")
                .then_some(r.body)
        },
    )
    .await;
    // Counted again at the PSP: one payment, succeeded, for this order.
    let books = psp_listing(&system.app, &system.url("psp-sim"), "payments").await;
    let ours: Vec<_> = books
        .iter()
        .filter(|p| {
            p["idempotency_key"]
                .as_str()
                .is_some_and(|k| k.ends_with(&id))
        })
        .collect();
    assert_eq!(ours.len(), 1, "{books:?}");
    assert_eq!(ours[0]["status"], "succeeded");
    assert_eq!(ours[0]["amount_captured"], order["total_minor"]);
    assert_eq!(order["payment"]["psp_payment_id"], ours[0]["id"]);

    // A certificate file that is not there is refused at start, naming the variable.
    let out = Command::new(soldonce_tests::relay::binary("payment-worker"))
        .arg("--check-config")
        .env_clear()
        .env("DATABASE_URL", &verified)
        .env("NATS_URL", system.nats.url())
        .env("PSP_URL", format!("https://localhost:{tls_port}"))
        .env("SSL_CERT_FILE", root.join("missing.pem"))
        .output()
        .expect("payment-worker --check-config");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("SSL_CERT_FILE"), "{said}");
}
