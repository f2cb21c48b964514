// The test cloud's gRPC face: cluster-autoscaler's externalgrpc CloudProvider
// service, served on loopback, each call forwarded as JSON (protojson of the
// request) to the harness's HTTP hook (e2e/autoscaler/cloud.py), which holds
// the node groups and starts and stops process-kubelet nodes. Nothing here
// decides anything: the Python side answers, this only translates. A
// template node comes back as the Kubernetes JSON of a v1.Node (its Go type
// is not a protobuf-go message). Pricing and per-group options answer
// Unimplemented, which the autoscaler takes as "use the defaults".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	apiv1 "k8s.io/api/core/v1"
	pb "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc/protos"
)

type server struct {
	pb.UnimplementedCloudProviderServer
	hook   string
	client *http.Client
}

// post sends one call to the hook and returns its JSON answer.
func (s *server) post(ctx context.Context, method string, req proto.Message) ([]byte, error) {
	body, err := protojson.Marshal(req)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.hook+"/"+method, bytes.NewReader(body))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(hreq)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if resp.StatusCode != http.StatusOK {
		code := codes.Internal
		if resp.StatusCode == http.StatusNotFound {
			code = codes.NotFound
		}
		return nil, status.Error(code, fmt.Sprintf("%s: %s", method, strings.TrimSpace(string(out))))
	}
	return out, nil
}

// call forwards req and decodes the answer into resp.
func call[T proto.Message](s *server, ctx context.Context, method string, req proto.Message, resp T) (T, error) {
	out, err := s.post(ctx, method, req)
	if err != nil {
		return resp, err
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(out, resp); err != nil {
		return resp, status.Error(codes.Internal, fmt.Sprintf("%s answer: %v", method, err))
	}
	return resp, nil
}

func (s *server) NodeGroups(ctx context.Context, r *pb.NodeGroupsRequest) (*pb.NodeGroupsResponse, error) {
	return call(s, ctx, "NodeGroups", r, &pb.NodeGroupsResponse{})
}

func (s *server) NodeGroupForNode(ctx context.Context, r *pb.NodeGroupForNodeRequest) (*pb.NodeGroupForNodeResponse, error) {
	return call(s, ctx, "NodeGroupForNode", r, &pb.NodeGroupForNodeResponse{})
}

func (s *server) GPULabel(ctx context.Context, r *pb.GPULabelRequest) (*pb.GPULabelResponse, error) {
	return call(s, ctx, "GPULabel", r, &pb.GPULabelResponse{})
}

func (s *server) GetAvailableGPUTypes(ctx context.Context, r *pb.GetAvailableGPUTypesRequest) (*pb.GetAvailableGPUTypesResponse, error) {
	return call(s, ctx, "GetAvailableGPUTypes", r, &pb.GetAvailableGPUTypesResponse{})
}

func (s *server) Cleanup(ctx context.Context, r *pb.CleanupRequest) (*pb.CleanupResponse, error) {
	return call(s, ctx, "Cleanup", r, &pb.CleanupResponse{})
}

func (s *server) Refresh(ctx context.Context, r *pb.RefreshRequest) (*pb.RefreshResponse, error) {
	return call(s, ctx, "Refresh", r, &pb.RefreshResponse{})
}

func (s *server) NodeGroupTargetSize(ctx context.Context, r *pb.NodeGroupTargetSizeRequest) (*pb.NodeGroupTargetSizeResponse, error) {
	return call(s, ctx, "NodeGroupTargetSize", r, &pb.NodeGroupTargetSizeResponse{})
}

func (s *server) NodeGroupIncreaseSize(ctx context.Context, r *pb.NodeGroupIncreaseSizeRequest) (*pb.NodeGroupIncreaseSizeResponse, error) {
	return call(s, ctx, "NodeGroupIncreaseSize", r, &pb.NodeGroupIncreaseSizeResponse{})
}

func (s *server) NodeGroupDeleteNodes(ctx context.Context, r *pb.NodeGroupDeleteNodesRequest) (*pb.NodeGroupDeleteNodesResponse, error) {
	return call(s, ctx, "NodeGroupDeleteNodes", r, &pb.NodeGroupDeleteNodesResponse{})
}

func (s *server) NodeGroupDecreaseTargetSize(ctx context.Context, r *pb.NodeGroupDecreaseTargetSizeRequest) (*pb.NodeGroupDecreaseTargetSizeResponse, error) {
	return call(s, ctx, "NodeGroupDecreaseTargetSize", r, &pb.NodeGroupDecreaseTargetSizeResponse{})
}

func (s *server) NodeGroupNodes(ctx context.Context, r *pb.NodeGroupNodesRequest) (*pb.NodeGroupNodesResponse, error) {
	return call(s, ctx, "NodeGroupNodes", r, &pb.NodeGroupNodesResponse{})
}

// NodeGroupTemplateNodeInfo: the hook answers {"nodeInfo": <v1.Node as Kubernetes JSON>}.
func (s *server) NodeGroupTemplateNodeInfo(ctx context.Context, r *pb.NodeGroupTemplateNodeInfoRequest) (*pb.NodeGroupTemplateNodeInfoResponse, error) {
	out, err := s.post(ctx, "NodeGroupTemplateNodeInfo", r)
	if err != nil {
		return nil, err
	}
	var answer struct {
		NodeInfo *apiv1.Node `json:"nodeInfo"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		return nil, status.Error(codes.Internal, fmt.Sprintf("NodeGroupTemplateNodeInfo answer: %v", err))
	}
	return &pb.NodeGroupTemplateNodeInfoResponse{NodeInfo: answer.NodeInfo}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "loopback address to serve gRPC on")
	hook := flag.String("hook", "", "the harness's HTTP hook, http://127.0.0.1:<port>")
	flag.Parse()
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() || !strings.HasPrefix(*hook, "http://127.") {
		log.Fatalf("test cloud: --listen and --hook must be loopback addresses (got %q, %q)", *listen, *hook)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("test cloud: listen: %v", err)
	}
	srv := grpc.NewServer()
	pb.RegisterCloudProviderServer(srv, &server{hook: *hook, client: &http.Client{Timeout: 30 * time.Second}})
	// The harness reads the chosen port from this line.
	fmt.Printf("listening %s\n", lis.Addr().String())
	if err := srv.Serve(lis); err != nil {
		log.Fatalf("test cloud: serve: %v", err)
	}
}
