//! Each agent refuses at start a device certificate made out to another
//! identity (docs/security.md section 3.2): the broker would take it for
//! that user, and its ACL would drop every frame of the agent while
//! acknowledging it, and deny its commands. The site is written by
//! `lwbus pki init` (hosts h01 and h02, controllers cdu1 and cdu2).

use std::path::{Path, PathBuf};

use loopwarden_field::common::CommonFlags;

fn site(dir: &Path) -> PathBuf {
    let out = dir.join("pki");
    loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
        site: "lab".into(),
        hosts: vec!["h01@cdu1".into(), "h02@cdu2".into()],
        cdus: vec!["cdu1".into(), "cdu2".into()],
        operators: Vec::new(),
        readers: Vec::new(),
        out: out.clone(),
        broker_port: 8883,
    })
    .expect("pki init");
    out
}

fn common(d: &Path, who: &str) -> CommonFlags {
    CommonFlags {
        site: Some("lab".into()),
        broker: Some("127.0.0.1:8883".into()),
        tls_ca: Some(d.join("ca.crt")),
        tls_cert: Some(d.join(format!("{who}.crt"))),
        tls_key: Some(d.join(format!("{who}.key"))),
        ..Default::default()
    }
}

fn node_agent(d: &Path, cert: &str) -> Result<(), String> {
    let flags = node_agent::config::Overrides {
        common: common(d, cert),
        host: Some("h01".into()),
        twin_gpus: Some(2),
        cdu: Some("cdu1".into()),
        keyring: Some(d.join("keyring.toml")),
        ..Default::default()
    };
    node_agent::config::resolve(None, "", &flags)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn cooling_ctrl(d: &Path, cert: &str) -> Result<(), String> {
    let flags = cooling_ctrl::config::Overrides {
        common: common(d, cert),
        ..Default::default()
    };
    // The demonstration key: a site key would need the CDU's register map
    // and the hall's figures too, which are beside the point here.
    let text = format!(
        "cdu = \"cdu1\"\ndemo_key = true\nkeyring = \"{}\"\ncdu_tcp = \"127.0.0.1:5020\"\n",
        d.join("keyring.toml").display()
    );
    cooling_ctrl::config::resolve(Some(Path::new("cdu.toml")), &text, &flags)
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
fn each_agent_refuses_a_certificate_of_another_identity() {
    let dir = tempfile::tempdir().unwrap();
    let d = site(dir.path());
    node_agent(&d, "h01").expect("h01 with its own certificate");
    let e = node_agent(&d, "h02").unwrap_err();
    assert!(
        e.starts_with("flag --tls-cert: TLS certificate ")
            && e.contains("h02.crt is made out to CN \"h02\"")
            && e.contains("this node is host \"h01\""),
        "{e}"
    );
    cooling_ctrl(&d, "cdu1").expect("cdu1 with its own certificate");
    for other in ["cdu2", "h01"] {
        let e = cooling_ctrl(&d, other).unwrap_err();
        assert!(
            e.contains(&format!("{other}.crt is made out to CN \"{other}\""))
                && e.contains("this node is CDU \"cdu1\""),
            "{e}"
        );
    }
}
