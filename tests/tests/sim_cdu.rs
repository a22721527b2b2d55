//! The simulated CDU on Modbus TCP, read and written by clients nobody
//! here wrote: `mbpoll` and Python's `pymodbus`.

use std::process::Command;

use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_system_tests::{
    mbpoll, mbpoll_values as values, require_python_module, require_tool,
};
use loopwarden_twin::sim_cdu::SimCdu;

/// A CDU with known measurements, served on a free loopback port.
fn serve() -> (SimCdu, u16, tokio::runtime::Runtime) {
    let cdu = SimCdu::new(
        RegisterMap::sim_cdu(),
        &[
            ("supply_setpoint", 30.0),
            ("pump_speed", 80.0),
            ("valves_open", 15.0),
        ],
    )
    .expect("settings in range");
    cdu.set_measurement("supply_temp", 32.05).unwrap();
    cdu.set_measurement("return_temp", -1.5).unwrap();
    cdu.set_measurement("flow", 172.8).unwrap();
    cdu.set_measurement("facility_power", 117_550.0).unwrap();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    rt.spawn(cdu.clone().serve(listener));
    (cdu, port, rt)
}

#[test]
fn mbpoll_reads_measurements_and_writes_settings_within_range_only() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let (cdu, port, _rt) = serve();
    // Input registers 0-2: supply 32.05 °C, return -1.5 °C, flow 172.8 L/min.
    let (ok, text) = mbpoll(port, &["-t", "3", "-r", "0", "-c", "3", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![3205, 65386, 1728], "{text}");
    // The 32-bit facility meter, high word first.
    let (ok, text) = mbpoll(port, &["-t", "3:hex", "-r", "14", "-c", "2", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("0x0001") && text.to_lowercase().contains("0xcb2e"),
        "{text}"
    );
    // A setting in range is taken...
    let (ok, text) = mbpoll(port, &["-t", "4", "-r", "0", "127.0.0.1", "3500"]);
    assert!(ok, "{text}");
    assert_eq!(cdu.setting("supply_setpoint").unwrap(), 35.0);
    // ...one out of range is refused with exception 3 and changes nothing.
    let (ok, text) = mbpoll(port, &["-t", "4", "-r", "0", "127.0.0.1", "5000"]);
    assert!(!ok, "{text}");
    assert!(text.to_lowercase().contains("illegal data value"), "{text}");
    assert_eq!(cdu.setting("supply_setpoint").unwrap(), 35.0);
    // An address the map does not have: exception 2.
    let (ok, text) = mbpoll(port, &["-t", "3", "-r", "7", "127.0.0.1"]);
    assert!(!ok, "{text}");
    assert!(
        text.to_lowercase().contains("illegal data address"),
        "{text}"
    );
}

const PYMODBUS: &str = r#"
import sys
from pymodbus.client import ModbusTcpClient
c = ModbusTcpClient("127.0.0.1", port=int(sys.argv[1]))
assert c.connect()
def unit(kw):
    # The unit-id keyword is `device_id` from pymodbus 3.10, `slave` before.
    try:
        return kw(device_id=1)
    except TypeError:
        return kw(slave=1)
r = unit(lambda **k: c.read_input_registers(10, count=6, **k))
assert not r.isError(), r
print("meters", r.registers)
r = unit(lambda **k: c.read_holding_registers(0, count=4, **k))
print("settings", r.registers)
r = unit(lambda **k: c.write_registers(0, [3300, 900], **k))
print("write", "error" if r.isError() else "ok")
r = unit(lambda **k: c.write_registers(0, [3300, 100], **k))
print("write_low_speed", r.exception_code if r.isError() else "ok")
r = unit(lambda **k: c.read_input_registers(7, count=1, **k))
print("read_unmapped", r.exception_code if r.isError() else "ok")
r = unit(lambda **k: c.read_coils(0, count=1, **k))
print("coils", r.exception_code if r.isError() else "ok")
c.close()
"#;

#[test]
fn pymodbus_sees_the_map_word_order_and_exceptions() {
    let Some(python) = require_python_module("pymodbus") else {
        return;
    };
    let (cdu, port, _rt) = serve();
    cdu.set_measurement("it_power", 108_400.0).unwrap();
    let out = Command::new(python)
        .args(["-c", PYMODBUS, &port.to_string()])
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // it_power 108,400 = 0x0001_A770, cooling 0, facility 117,550 = 0x0001_CB2E.
    assert!(text.contains("meters [1, 42864, 0, 0, 1, 52014]"), "{text}");
    assert!(text.contains("settings [3000, 800, 0, 15]"), "{text}");
    assert!(text.contains("write ok"), "{text}");
    assert_eq!(cdu.setting("supply_setpoint").unwrap(), 33.0);
    assert_eq!(cdu.setting("pump_speed").unwrap(), 90.0);
    // 10 % pump speed is below the 30 % minimum: exception 3, nothing written.
    assert!(text.contains("write_low_speed 3"), "{text}");
    assert_eq!(cdu.setting("pump_speed").unwrap(), 90.0);
    assert!(text.contains("read_unmapped 2"), "{text}");
    assert!(text.contains("coils 1"), "{text}");
}

/// The hall writes the dry cooler's outdoor sensor into input register 20
/// (i16, 0.01 °C), with the scenario's faults: a lost sensor reads 0x8000,
/// never a plausible 0 °C.
#[test]
fn mbpoll_reads_the_halls_outdoor_sensor_and_its_loss() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    use loopwarden_boards::pins::PinMap;
    use loopwarden_twin::hall::Hall;
    use loopwarden_twin::pins::SimLines;
    use loopwarden_twin::scenario::Scenario;
    let sc = Scenario::from_toml(
        "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 60\nseed = 1\n\
         [site]\nracks = 1\nhosts_per_rack = 1\n[ambient]\npoints = [[0, -7.25]]\n\
         [load]\nall = [[0, 0.5]]\n\
         [[fault]]\nat_s = 10\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n",
        "t.toml",
    )
    .expect("a valid scenario");
    let (cdu, port, _rt) = serve();
    let mut hall = Hall::new(sc, cdu, SimLines::new(), PinMap::sim_controller());
    let outdoor = || {
        let (ok, text) = mbpoll(port, &["-t", "3", "-r", "20", "127.0.0.1"]);
        assert!(ok, "{text}");
        values(&text)
    };
    hall.step(1.0).expect("a step");
    // -7.25 °C: -725, unsigned 64811.
    assert_eq!(outdoor(), vec![64811]);
    for _ in 1..10 {
        hall.step(1.0).expect("a step");
    }
    assert_eq!(outdoor(), vec![32768], "lost: 0x8000");
}
