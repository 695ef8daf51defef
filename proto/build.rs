//! Compiles `proto/allot/**/*.proto` with protox (pure Rust: no protoc on the machine).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "allot/lease/v1/lease.proto",
        "allot/raft/v1/raft.proto",
        "allot/sync/v1/sync.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
