// IPC handle exchange through the seam (host implementation): two instances sharing one
// HostIpcSpace play two processes on one host.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "device/host_device_copy.h"
#include "device/ipc_handle.h"

namespace kvferry::device {
namespace {

uint8_t* at(uint64_t a) { return reinterpret_cast<uint8_t*>(a); }

struct Host {
  std::shared_ptr<HostIpcSpace> space = std::make_shared<HostIpcSpace>();
  HostDeviceCopy decode{{.devices = 2}, space};
  HostDeviceCopy prefill{{.devices = 2}, space};
};

// What travels: the handle's bytes, parsed by the importer before use.
Result<uint64_t> receive(HostDeviceCopy& d, int32_t ordinal, const std::string& wire, uint64_t agreed) {
  auto h = parse_ipc_handle(wire);
  if (!h.ok()) return h.status();
  return d.open_ipc(ordinal, *h, agreed);
}

TEST(DeviceIpc, ExportedBufferIsWrittenByThePeer) {
  Host host;
  auto alloc = host.decode.alloc_device(1, 1 << 16);
  ASSERT_TRUE(alloc.ok());
  const uint64_t buffer = *alloc + 4096;  // a buffer inside a larger allocation
  auto h = host.decode.export_ipc(1, buffer, 8192);
  ASSERT_TRUE(h.ok()) << h.status().str();
  EXPECT_EQ(h->offset, 4096u);
  auto mapped = receive(host.prefill, 1, encode_ipc_handle(*h), 8192);
  ASSERT_TRUE(mapped.ok()) << mapped.status().str();
  auto src = host.prefill.alloc_pinned(8192);
  ASSERT_TRUE(src.ok());
  std::memset(at(*src), 0x3c, 8192);
  const CopyRun run{*src, *mapped + 100, 500};
  auto t = host.prefill.copy_batch(1, 2, std::span(&run, 1));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(host.prefill.wait(*t).ok());
  EXPECT_EQ(at(buffer)[99], 0);
  EXPECT_EQ(at(buffer)[100], 0x3c);
  EXPECT_EQ(at(buffer)[599], 0x3c);
  EXPECT_EQ(at(buffer)[600], 0);
  EXPECT_TRUE(host.prefill.close_ipc(*mapped).ok());
  EXPECT_FALSE(host.prefill.close_ipc(*mapped).ok());
}

TEST(DeviceIpc, RefusesHandlesThatDoNotFitTheAgreement) {
  Host host;
  auto alloc = host.decode.alloc_device(0, 1 << 16);
  ASSERT_TRUE(alloc.ok());
  auto h = host.decode.export_ipc(0, *alloc, 1 << 16);
  ASSERT_TRUE(h.ok());
  const std::string wire = encode_ipc_handle(*h);
  auto why = [&](int32_t ordinal, const std::string& bytes, uint64_t agreed) {
    auto r = receive(host.prefill, ordinal, bytes, agreed);
    if (r.ok()) return std::string("accepted");
    EXPECT_EQ(r.status().code(), ErrorCode::kProtocolError) << r.status().str();
    return r.status().message();
  };
  // The wrong device, the wrong size: refused before the handle's payload is looked at.
  EXPECT_NE(why(1, wire, 1 << 16).find("ipc handle of cuda device 0, opened on cuda device 1"), std::string::npos);
  EXPECT_NE(why(0, wire, 4096).find("ipc handle of 65536 bytes, agreed 4096"), std::string::npos);
  // Short and garbage bytes never reach the seam.
  EXPECT_NE(why(0, wire.substr(0, 40), 1 << 16).find("40 bytes"), std::string::npos);
  EXPECT_NE(why(0, std::string(kIpcHandleBytes, 'x'), 1 << 16).find("bad magic"), std::string::npos);

  IpcHandle forged = *h;
  forged.payload[20] ^= 1;
  EXPECT_NE(why(0, encode_ipc_handle(forged), 1 << 16).find("forged"), std::string::npos);
  IpcHandle other_device = *h;  // a device the allocation is not on, claimed to fit the opener
  other_device.device = 1;
  EXPECT_NE(why(1, encode_ipc_handle(other_device), 1 << 16).find("its allocation is on cuda device 0"),
            std::string::npos);
  IpcHandle too_long = *h;  // an extent past the allocation, with a matching agreement
  too_long.offset = 4096;
  EXPECT_NE(why(0, encode_ipc_handle(too_long), 1 << 16).find("outside its allocation"), std::string::npos);

  HostDeviceCopy elsewhere({.devices = 1});  // another host: another space
  EXPECT_NE(receive(elsewhere, 0, wire, 1 << 16).status().message().find("forged"), std::string::npos);

  EXPECT_EQ(why(0, wire, 1 << 16), "accepted");
  ASSERT_TRUE(host.decode.free_device(*alloc).ok());
  EXPECT_NE(why(0, wire, 1 << 16).find("freed"), std::string::npos) << "a freed allocation's handle is dead";
}

TEST(DeviceIpc, ExportRefusesWhatIsNotDeviceMemoryOfTheDevice) {
  Host host;
  auto dev = host.decode.alloc_device(0, 4096);
  auto pinned = host.decode.alloc_pinned(4096);
  ASSERT_TRUE(dev.ok() && pinned.ok());
  EXPECT_FALSE(host.decode.export_ipc(1, *dev, 4096).ok());
  EXPECT_FALSE(host.decode.export_ipc(0, *pinned, 4096).ok());
  EXPECT_FALSE(host.decode.export_ipc(0, *dev + 1, 4096).ok());  // past the allocation
  EXPECT_FALSE(host.decode.export_ipc(2, *dev, 4096).ok());      // no such device
  EXPECT_TRUE(host.decode.export_ipc(0, *dev + 1, 4095).ok());
}

}  // namespace
}  // namespace kvferry::device
