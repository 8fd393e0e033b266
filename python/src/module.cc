// _kvferry: the compiled half of the Python package `kvferry` (python/kvferry/__init__.py holds the
// Python-facing classes: KVPoll, KVTransferError, KVManager, KVSender, KVReceiver).
//
// Memory: either engine-owned buffers, as (address, bytes, item_bytes, kind, memory[, device])
// tuples made by kvferry.describe_buffers (python/kvferry/buffers.py keeps the objects alive;
// kvferry/buffers.h),
// or one KV pool: any writable C-contiguous buffer-protocol object (numpy array, bytearray,
// memoryview), held here (so it cannot be resized or freed) and released after the rank is torn
// down. The manager registers the memory with the transport; nothing is copied.
// Page and row indices are sequences of Python ints (lists, numpy integer arrays).
// GIL: released in every call that may block (rank start-up, the manager's lock, log waits).
// Errors: bad arguments raise ValueError naming the value; other failures RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/request_mac.h"
#include "core/secret.h"
#include "kvferry/bootstrap.h"
#include "log_queue.h"
#include "manager.h"

namespace py = pybind11;

namespace kvferry::python {
namespace {

// A refused call raises ValueError (invalid_argument) or RuntimeError (anything else) carrying the
// C++ error's code as its `code` attribute (snake_case, kvferry/error.h code_name), so Python never
// parses it from the text.
[[noreturn]] void raise_status(const Status& s) {
  const bool invalid = s.code() == ErrorCode::kInvalidArgument;
  py::handle type = invalid ? PyExc_ValueError : PyExc_RuntimeError;
  py::object e = type(invalid ? s.message() : s.str());
  e.attr("code") = std::string(code_name(s.code()));
  PyErr_SetObject(type.ptr(), e.ptr());
  throw py::error_already_set();
}

void check(const Status& s) {
  if (!s.ok()) raise_status(s);
}

BufferKind buffer_kind(const std::string& k) {
  for (BufferKind b : {BufferKind::kKv, BufferKind::kAux, BufferKind::kState})
    if (buffer_kind_name(b) == k) return b;
  throw py::value_error("buffer kind must be 'kv', 'aux' or 'state', not '" + k + "'");
}

MemoryKind memory_kind(const std::string& k) {
  for (MemoryKind m : {MemoryKind::kHost, MemoryKind::kCuda})
    if (memory_kind_name(m) == k) return m;
  throw py::value_error("memory kind must be 'host' or 'cuda', not '" + k + "'");
}

// (address, bytes, item_bytes, kind, memory[, device]) tuples (BufferDesc.as_tuple()) as
// BufferDescs; device: the CUDA device ordinal of a "cuda" buffer (default 0; docs/gpu.md).
std::vector<BufferDesc> buffer_descs(const py::list& buffers) {
  std::vector<BufferDesc> out;
  for (const py::handle& h : buffers) {
    auto t = h.cast<py::tuple>();
    if (t.size() != 5 && t.size() != 6)
      throw py::value_error("a buffer is (address, bytes, item_bytes, kind, memory[, device])");
    out.push_back(BufferDesc{t[0].cast<uint64_t>(), t[1].cast<uint64_t>(), t[2].cast<uint64_t>(),
                             buffer_kind(t[3].cast<std::string>()), memory_kind(t[4].cast<std::string>()),
                             t.size() == 6 ? t[5].cast<int32_t>() : 0});
  }
  return out;
}

// A held, writable, C-contiguous view of the engine's pool.
class PoolBuffer {
 public:
  explicit PoolBuffer(const py::object& obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0)
      throw py::error_already_set();
    held_ = true;
  }
  ~PoolBuffer() { release(); }
  void release() {
    if (held_) PyBuffer_Release(&view_);
    held_ = false;
  }
  uint8_t* data() const { return static_cast<uint8_t*>(view_.buf); }
  uint64_t bytes() const { return static_cast<uint64_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// The Python object: the rank plus the pool it registered (released only after the rank is gone).
class PyManager {
 public:
  PyManager(const std::string& role, const py::object& pool, const py::list& buffers, const py::dict& geometry,
            uint32_t page_size, uint32_t aux_slots, const std::string& bootstrap, const std::string& transport,
            uint32_t tp_rank, uint32_t tp_size, uint32_t peer_tp_size, const py::dict& deadlines,
            const std::string& log_file, uint32_t transfer_shards, bool log_failures,
            const std::string& control_bind, const std::string& control_advertise, uint16_t control_port,
            bool fault_injection, bool integrity, uint32_t dp_rank, uint32_t peer_dp_size, uint32_t engine_id) {
    ConnectorConfig c;
    if (role == "prefill" && engine_id != 0)
      throw py::value_error("a prefill engine's engine_id is 0 (decode looks its ranks up under engine 0)");
    c.engine_id = engine_id;
    if (peer_dp_size < 1) throw py::value_error("peer_dp_size must be at least 1");
    c.dp_rank = dp_rank;
    c.peer_dp_size = peer_dp_size;
    c.fault_injection = fault_injection;
    c.integrity = integrity;
    c.buffers = buffer_descs(buffers);
    if (pool.is_none() == c.buffers.empty()) throw py::value_error("give a KV pool or engine buffers (one of them)");
    if (!pool.is_none()) pool_ = std::make_unique<PoolBuffer>(pool);
    if (role == "prefill") c.role = Role::kPrefill;
    else if (role == "decode") c.role = Role::kDecode;
    else throw py::value_error("role must be 'prefill' or 'decode', not '" + role + "'");
    if (Status st = check_transport_name(transport); !st.ok()) throw py::value_error(st.message());
    c.transport = transport;
    if (transfer_shards < 1 || transfer_shards > kMaxTransportShards)
      throw py::value_error("transfer_shards must be in 1.." + std::to_string(kMaxTransportShards));
    c.transfer_shards = transfer_shards;
    c.model = geometry_from(geometry);
    c.page_size = page_size;
    c.aux_slots = aux_slots;
    c.bootstrap = bootstrap;
    c.tp_rank = tp_rank;
    c.tp_size = tp_size;
    c.peer_tp_size = peer_tp_size;
    c.deadlines = deadlines_from_env();
    for (auto [k, v] : deadlines) {
      std::string key = py::str(k);
      bool known = false;
      for (const DeadlineField& f : deadline_fields()) {
        std::string name = std::string(f.option).substr(2);
        for (char& ch : name) ch = ch == '-' ? '_' : ch;
        if (name == key) {
          int64_t ms = v.cast<int64_t>();
          if (ms <= 0) throw py::value_error(key + " must be a positive number of milliseconds");
          c.deadlines.*f.member = ms;
          known = true;
        }
      }
      if (!known) throw py::value_error("unknown deadline '" + key + "'");
    }
    c.log_file = log_file;
    c.log_failures = log_failures;
    c.control_bind = control_bind;
    c.control_advertise = control_advertise;
    c.control_port = control_port;
    if (pool_) {
      c.pool = pool_->data();
      c.pool_bytes = pool_->bytes();
    }
    Result<std::unique_ptr<Connector>> m = Status();
    {
      py::gil_scoped_release nogil;
      m = Connector::create(c);
    }
    if (!m.ok()) raise_status(m.status());
    m_ = std::move(m).value();
  }
  ~PyManager() { close(); }

  // Tears the rank down (no call can use the pool after this), then lets go of the pool.
  void close() {
    if (m_) {
      std::shared_ptr<Connector> m = m_;
      py::gil_scoped_release nogil;
      m->close();
    }
    m_.reset();
    if (pool_) pool_->release();
  }

  // Shared: a call running with the GIL released keeps the manager alive through a close().
  std::shared_ptr<Connector> m() {
    if (!m_) throw std::runtime_error("the manager is closed");
    return m_;
  }

  static ModelGeometry geometry_from(const py::dict& g) {
    ModelGeometry m;
    m.name = g.contains("name") ? py::str(g["name"]) : py::str("custom");
    m.attention = g.contains("attention") ? py::str(g["attention"]) : py::str("GQA");
    m.num_layers = g["num_layers"].cast<uint32_t>();
    m.tensors_per_layer = g.contains("tensors_per_layer") ? g["tensors_per_layer"].cast<uint32_t>() : 2;
    m.cache_heads = g["num_kv_heads"].cast<uint32_t>();
    m.head_dim = g["head_dim"].cast<uint32_t>();
    m.dtype_bytes = g.contains("dtype_bytes") ? g["dtype_bytes"].cast<uint32_t>() : 2;
    if (m.num_layers == 0 || m.tensors_per_layer == 0 || m.cache_heads == 0 || m.head_dim == 0 || m.dtype_bytes == 0)
      throw py::value_error("num_layers, tensors_per_layer, num_kv_heads, head_dim and dtype_bytes must be positive");
    return m;
  }

  std::unique_ptr<PoolBuffer> pool_;
  std::shared_ptr<Connector> m_;
};

py::dict layout_dict(const PoolLayout& l) {
  py::dict d;
  d["num_pages"] = l.num_pages;
  d["page_size"] = l.page_size;
  d["num_buffers"] = l.num_buffers();
  d["token_bytes"] = l.token_bytes();
  d["page_bytes"] = l.page_bytes();
  d["buffer_bytes"] = l.buffer_bytes();
  d["aux_slots"] = l.aux_slots;
  d["aux_offset"] = l.aux_offset(0);
  d["aux_slot_bytes"] = kAuxSlotBytes;
  d["total_bytes"] = l.total_bytes();
  d["heads_per_rank"] = l.heads_per_rank;
  d["first_head"] = l.first_head;
  return d;
}

py::object failure_tuple(const std::optional<KVTransferError>& e) {
  if (!e) return py::none();
  return py::make_tuple(e->bootstrap_room, e->failure_reason, e->is_from_another_rank, e->origin.str(),
                        std::string(code_name(e->code)));
}

}  // namespace
}  // namespace kvferry::python

PYBIND11_MODULE(_kvferry, mod) {
  using namespace kvferry;
  using namespace kvferry::python;
  mod.doc() = "kvferry's compiled core; use the `kvferry` package";
  using nogil = py::call_guard<py::gil_scoped_release>;

  // The Authorization header value of one request to a bootstrap service (docs/security.md): a MAC
  // of (method, target: path and query string as sent, body bytes) with the cluster's bootstrap MAC
  // key, a fresh nonce and the current time (core/request_mac.h), so the key never reaches Python
  // and a server the request goes to learns nothing that authenticates another request. Keys from
  // KVFERRY_SECRET_FILE / KVFERRY_SECRET like the C++ side; None when no secret is set; ValueError
  // for a bad secret file.
  mod.def(
      "bootstrap_authorization",
      [](const std::string& method, const std::string& target, const py::bytes& body) -> py::object {
        auto keys = security::cluster_keys();
        check(keys.status());
        if (!*keys) return py::none();
        return py::str(security::mac_authorization(**keys, method, target, std::string(body)));
      },
      py::arg("method"), py::arg("target"), py::arg("body") = py::bytes());

  py::class_<PyManager>(mod, "Manager")
      .def(py::init<const std::string&, const py::object&, const py::list&, const py::dict&, uint32_t, uint32_t,
                    const std::string&, const std::string&, uint32_t, uint32_t, uint32_t, const py::dict&,
                    const std::string&, uint32_t, bool, const std::string&, const std::string&, uint16_t, bool, bool, uint32_t, uint32_t, uint32_t>(),
           py::arg("role"), py::arg("pool"), py::arg("buffers"), py::arg("geometry"), py::arg("page_size"),
           py::arg("aux_slots"),
           py::arg("bootstrap_addr"), py::arg("transport"), py::arg("tp_rank"), py::arg("tp_size"),
           py::arg("peer_tp_size"), py::arg("deadlines"), py::arg("log_file"), py::arg("transfer_shards"), py::arg("log_failures") = true,
           py::arg("control_bind") = "", py::arg("control_advertise") = "", py::arg("control_port") = 0, py::arg("fault_injection") = false,
           py::arg("integrity") = false, py::arg("dp_rank") = 0, py::arg("peer_dp_size") = 1,
           py::arg("engine_id") = 0)
      .def("close", &PyManager::close)
      .def_property_readonly("layout", [](PyManager& p) { return layout_dict(p.m()->layout()); })
      .def_property_readonly("rank", [](PyManager& p) { return p.m()->self().str(); })
      .def_property_readonly("control_endpoint", [](PyManager& p) { return p.m()->control_endpoint(); })
      .def("room_open", [](PyManager& p, uint64_t room, const std::string& bootstrap, int64_t dp_rank) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->open(room, bootstrap, dp_rank);
        }
        check(s);
      })
      .def("sender_init", [](PyManager& p, uint64_t room, uint64_t pages, int64_t aux, uint64_t tokens) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->sender_init(room, pages, aux, tokens);
        }
        check(s);
      })
      .def("sender_send", [](PyManager& p, uint64_t room, const std::vector<int64_t>& pages,
                             const std::vector<int64_t>& state, std::optional<bool> last,
                             std::optional<std::pair<int64_t, int64_t>> layers) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->sender_send(room, pages, state, last, layers);
        }
        check(s);
      }, py::arg("room"), py::arg("pages"), py::arg("state"), py::arg("last"), py::arg("layers") = py::none())
      .def("receiver_init", [](PyManager& p, uint64_t room, const std::vector<int64_t>& kv, int64_t aux,
                               const std::vector<int64_t>& state, uint64_t tokens) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->receiver_init(room, kv, aux, state, tokens);
        }
        check(s);
      })
      .def("sender_take_completed_sends", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Result<std::vector<uint64_t>> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->take_completed_sends(room);
        }
        if (!r.ok()) raise_status(r.status());
        return *r;
      })
      .def("room_release_safe", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Result<bool> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->release_safe(room);
        }
        if (!r.ok()) raise_status(r.status());
        return *r;
      })
      .def("room_quarantined", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Result<bool> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->quarantined(room);
        }
        if (!r.ok()) raise_status(r.status());
        return *r;
      })
      .def("room_fail_from_engine", [](PyManager& p, uint64_t room, const std::string& code, const std::string& reason,
                                  const std::string& origin) {
        auto c = code_from_name(code);
        if (!c || *c == ErrorCode::kOk) throw py::value_error("unknown error code '" + code + "'");
        auto o = RankId::parse(origin);
        if (!o) throw py::value_error("origin '" + origin + "' is not a rank (e.g. 'prefill/tp1')");
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->fail_from_engine(room, *c, reason, *o);
        }
        check(s);
      })
      .def("room_fail_from_agreement", [](PyManager& p, uint64_t room, const std::string& code, const std::string& reason,
                                     int64_t wait_ms) {
        auto c = code_from_name(code);
        if (!c || *c == ErrorCode::kOk) throw py::value_error("unknown error code '" + code + "'");
        std::shared_ptr<Connector> m = p.m();
        Result<KVTransferError> e = Status();
        {
          py::gil_scoped_release nogil;
          e = m->fail_from_agreement(room, *c, reason, wait_ms);
        }
        if (!e.ok()) raise_status(e.status());
        return failure_tuple(*e);
      })
      .def("hold_writes", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->hold_writes(room);
        }
        check(s);
      })
      .def("release_held_writes", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->release_held_writes(room);
        }
        check(s);
      })
      .def("held_writes", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Result<size_t> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->held_writes(room);
        }
        check(r.status());
        return r.value();
      })
      .def("room_poll", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        py::gil_scoped_release nogil;
        return static_cast<int>(m->poll(room));
      })
      .def("room_metrics", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Result<TransferMetrics> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->metrics(room);
        }
        if (!r.ok()) raise_status(r.status());
        py::dict d;
        d["bytes"] = r->bytes;
        d["latency_s"] = r->latency_s();
        d["wait_metadata_s"] = r->wait_metadata_s();
        d["created_ns"] = r->created_ns;
        d["metadata_ns"] = r->metadata_ns;
        d["first_send_ns"] = r->first_send_ns;
        d["done_ns"] = r->done_ns;
        return d;
      })
      .def("room_failure", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        std::optional<KVTransferError> e;
        {
          py::gil_scoped_release nogil;
          e = m->failure(room);
        }
        return failure_tuple(e);
      })
      .def("room_abort", [](PyManager& p, uint64_t room, const std::string& reason) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->abort(room, reason);
        }
        check(s);
      })
      .def("room_fail", [](PyManager& p, uint64_t room, const std::string& code, const std::string& reason) {
        auto c = code_from_name(code);
        if (!c || *c == ErrorCode::kOk) throw py::value_error("unknown error code '" + code + "'");
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->fail_local(room, *c, reason);
        }
        check(s);
      })
      .def("room_close", [](PyManager& p, uint64_t room) {
        if (!p.m_) return;  // the manager went first: nothing to release
        std::shared_ptr<Connector> m = p.m_;
        py::gil_scoped_release nogil;
        m->close_room(room);
      })
      .def("inject_write_failure", [](PyManager& p, uint64_t room, const std::string& code, const std::string& reason) {
        auto c = code_from_name(code);
        if (!c || *c == ErrorCode::kOk) throw py::value_error("unknown error code '" + code + "'");
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->inject_write_failure(room, *c, reason);
        }
        check(s);
      })
      .def("corrupt_next_write", [](PyManager& p, uint64_t room) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->corrupt_next_write(room);
        }
        check(s);
      })
      .def("aux_row", [](PyManager& p, int64_t slot) {
        std::shared_ptr<Connector> m = p.m();
        Result<AuxRecord> r = Status();
        {
          py::gil_scoped_release nogil;
          r = m->aux(slot);
        }
        if (!r.ok()) raise_status(r.status());
        py::dict d;
        d["room"] = r->room;
        d["cached_tokens"] = r->cached_tokens;
        d["num_pages"] = r->num_pages;
        return d;
      })
      .def("live_rooms", [](PyManager& p) {
        std::shared_ptr<Connector> m = p.m();
        py::gil_scoped_release nogil;
        return m->live_rooms();
      })
      .def("peers", [](PyManager& p) {
        std::shared_ptr<Connector> m = p.m();
        py::gil_scoped_release nogil;
        return m->peers();
      })
      .def("leave", [](PyManager& p, int64_t timeout_ms) {
        std::shared_ptr<Connector> m = p.m();
        Status s;
        {
          py::gil_scoped_release nogil;
          s = m->leave(timeout_ms);
        }
        check(s);
      }, py::arg("timeout_ms") = 2000)
      .def("drained", [](PyManager& p) {
        std::shared_ptr<Connector> m = p.m();
        py::gil_scoped_release nogil;
        return m->drained();
      })
      .def("take_reclaimed_rooms", [](PyManager& p) {
        std::shared_ptr<Connector> m = p.m();
        py::gil_scoped_release nogil;
        return m->take_reclaimed_rooms();
      });

  mod.def(
      "layout_for_pages",
      [](const py::dict& geometry, uint32_t page_size, uint32_t aux_slots, uint32_t tp_rank, uint32_t tp_size,
         uint64_t num_pages) {
        ConnectorConfig c;
        c.model = PyManager::geometry_from(geometry);
        c.page_size = page_size;
        c.aux_slots = aux_slots;
        c.tp_rank = tp_rank;
        c.tp_size = tp_size;
        auto l = layout_for_pages(c, num_pages);
        if (!l.ok()) raise_status(l.status());
        return layout_dict(*l);
      },
      py::arg("geometry"), py::arg("page_size"), py::arg("aux_slots"), py::arg("tp_rank"), py::arg("tp_size"),
      py::arg("num_pages"));

  py::class_<BootstrapServer>(mod, "BootstrapServer")
      .def(py::init([](const std::string& host, uint16_t port) {
             auto s = BootstrapServer::start(host, port);
             if (!s.ok()) raise_status(s.status());
             return std::move(s).value();
           }),
           py::arg("host") = "127.0.0.1", py::arg("port") = 0)
      .def_property_readonly("port", &BootstrapServer::port)
      .def("registered", &BootstrapServer::registered);

  mod.def("log_install", [](int min_level) { LogQueue::instance().install(static_cast<LogLevel>(min_level)); });
  mod.def("log_uninstall", [] { LogQueue::instance().uninstall(); }, nogil());
  mod.def("log_wait", [](int timeout_ms) { return LogQueue::instance().wait(timeout_ms); }, nogil());
  mod.def("log_dropped", [] { return LogQueue::instance().dropped(); });
  mod.def("log_take", [](int timeout_ms) {
    std::vector<QueuedLine> lines;
    {
      py::gil_scoped_release nogil;
      lines = LogQueue::instance().take(timeout_ms);
    }
    py::list out;
    for (QueuedLine& l : lines) {
      py::dict extra;
      for (auto& [k, v] : l.extra) extra[py::str(k)] = v;
      out.append(py::make_tuple(static_cast<int>(l.level), l.component, l.msg,
                                l.room ? py::object(py::int_(*l.room)) : py::object(py::none()), l.code, l.origin,
                                extra));
    }
    return out;
  });
}
