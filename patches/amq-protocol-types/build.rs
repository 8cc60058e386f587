//! Tells the crates that depend on this one directly that the codec in the
//! build is urutan's patched one (`links = "urutan_amqp_codec"` in
//! Cargo.toml): they read it as `DEP_URUTAN_AMQP_CODEC_PATCHED`. The
//! upstream crate has no build script, so without this patch the variable is
//! absent and `crates/urutan/build.rs` stops the build with the lines to add.
fn main() {
    println!("cargo::metadata=PATCHED=hostile-peers-1");
}
