// Proves a generated gRPC service serves a real call on 127.0.0.1.
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "third_party/grpc/echo.grpc.pb.h"

namespace {

class EchoService final : public ember::third_party::Echo::Service {
  grpc::Status Say(grpc::ServerContext*,
                   const ember::third_party::EchoRequest* request,
                   ember::third_party::EchoReply* reply) override {
    reply->set_text("echo: " + request->text());
    return grpc::Status::OK;
  }
};

TEST(GrpcTest, ServesACallOnLoopback) {
  EchoService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  auto stub = ember::third_party::Echo::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ember::third_party::EchoRequest req;
  req.set_text("hi");
  ember::third_party::EchoReply reply;
  grpc::Status status = stub->Say(&ctx, req, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.text(), "echo: hi");
  server->Shutdown();
}

}  // namespace
