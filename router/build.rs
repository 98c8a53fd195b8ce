//! Compiles the shard protocol (`proto/shard.proto`) with a vendored `protoc`, so the build
//! needs nothing installed beyond cargo.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=../proto/shard.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .compile_protos(&["../proto/shard.proto"], &["../proto"])?;
    Ok(())
}
