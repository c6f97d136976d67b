//! `sqlx::migrate!` embeds the migrations when this crate compiles: rebuild
//! it whenever one is added or changed, or a build would run an old schema.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
